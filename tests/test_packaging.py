"""The conda environment, pyproject and Makefile agree on what is installed."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _name(req: str) -> str:
    return re.split(r"[<>=!~ \[]", req.strip(), maxsplit=1)[0].lower()


def _pyproject_requirements() -> dict[str, str]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = meta["dependencies"] + meta["optional-dependencies"]["dev"]
    return {_name(r): r.replace(" ", "") for r in reqs}


def _conda_pip_requirements() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    return {_name(r.replace("--no-deps ", "")): r.replace(" ", "") for r in pip}


def test_environment_yml_matches_pyproject():
    project, conda = _pyproject_requirements(), _conda_pip_requirements()
    missing = {k: v for k, v in project.items() if conda.get(k) != v}
    assert not missing, f"environment.yml lacks or pins differently: {missing}"


def test_environment_yml_python_is_the_supported_minimum():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pinned = [d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python=")]
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert pinned == [f"python={requires.removeprefix('>=')}"], (pinned, requires)


def test_makefile_vbench_extras_are_in_environment_yml():
    """VBench and its runtime imports are installed by the Makefile beside pyproject's deps; VBench itself
    (--no-deps) is the documented step after creating the conda env."""
    makefile = (ROOT / "Makefile").read_text()
    conda = _conda_pip_requirements()
    for pkg in ("decord", "opencv-python-headless", "easydict"):
        assert pkg in makefile, pkg
        assert pkg in conda, pkg
    assert "pip install -q --no-deps vbench==0.1.5" in makefile
    assert "pip install --no-deps vbench==0.1.5" in (ROOT / "environment.yml").read_text()


def test_environment_yml_pip_entries_are_valid_requirements():
    """conda passes the pip list to pip as a requirements file: each line must be a plain requirement
    (an option such as --no-deps there makes `conda env create` fail)."""
    from packaging.requirements import InvalidRequirement, Requirement

    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    for line in pip:
        try:
            Requirement(line)
        except InvalidRequirement as err:
            raise AssertionError(f"environment.yml pip entry {line!r} is not a requirement: {err}") from None


def _setup_recipe_requirements() -> set[str]:
    """Requirements the Makefile's setup recipe installs with pip (shell words after `pip install`)."""
    import shlex

    words: set[str] = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        if "pip install" in line:
            words.update(w for w in shlex.split(line.split("pip install", 1)[1]) if not w.startswith("-"))
    return words


def test_setup_installs_what_the_default_vbench_dimensions_import():
    """Every package the default dimensions' scorers import is installed by `make setup` and the conda env."""
    from jensenkv.eval.vbench import DEFAULT_DIMENSIONS, DIMENSION_PACKAGES

    needed = {pip for dim in DEFAULT_DIMENSIONS for _, pip in DIMENSION_PACKAGES[dim]}
    conda = {r.replace(" ", "") for r in _conda_pip_requirements().values()}
    recipe = _setup_recipe_requirements()
    for pip in needed:
        assert any(r == pip or _name(r) == _name(pip) for r in recipe), f"make setup does not install {pip}"
        assert any(r == pip.replace(" ", "") or _name(r) == _name(pip) for r in conda), f"environment.yml lacks {pip}"
