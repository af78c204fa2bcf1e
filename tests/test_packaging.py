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


def test_setup_pins_torch_inside_pyproject_range_through_constraints():
    """pyproject allows the tested torch range (2.11 on the GPU machine); `make setup` pins the versions the
    results were made with through constraints.txt, and each pin lies inside pyproject's range."""
    from packaging.requirements import Requirement

    project = {Requirement(r).name: Requirement(r) for r in
               tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    pins = [Requirement(line) for line in (ROOT / "constraints.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    assert {p.name for p in pins} == {"torch", "torchvision"}
    for pin in pins:
        (version,) = [s.version for s in pin.specifier if s.operator == "=="]
        assert project[pin.name].specifier.contains(version), (pin, project[pin.name])
    assert project["torch"].specifier.contains("2.11.0") and not project["torch"].specifier.contains("2.15.0")
    assert "pip install -q -c constraints.txt -e" in (ROOT / "Makefile").read_text()


def test_gpu_wheels_name_one_exact_version_each_and_not_the_machines_own():
    """make gpu-wheels: what the bare GPU machine lacks, each pinned once; never torch, triton or numpy, whose
    versions on that machine are the ones under test."""
    from packaging.requirements import Requirement

    lines = [line.split("#")[0].strip() for line in (ROOT / "gpu-wheels.txt").read_text().splitlines()]
    reqs = [Requirement(line) for line in lines if line]
    names = [r.name.lower() for r in reqs]
    assert len(names) == len(set(names))
    assert all(len(r.specifier) == 1 and next(iter(r.specifier)).operator == "==" for r in reqs)
    assert {"hydra-core", "omegaconf", "antlr4-python3-runtime", "diffusers"} <= set(names)
    assert not {"torch", "triton", "numpy", "torchvision"} & set(names)
    project = {_name(r): r for r in _pyproject_requirements().values()}
    for req in reqs:  # the suite's own pins, where it has them
        if req.name.lower() in project and "==" in project[req.name.lower()]:
            assert project[req.name.lower()] == str(req), (req, project[req.name.lower()])
    assert ".whl/" in (ROOT / ".gitignore").read_text().splitlines()  # the wheels travel by carry, never in git
