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
    """VBench and its runtime imports are installed by the Makefile beside pyproject's deps."""
    makefile = (ROOT / "Makefile").read_text()
    conda = _conda_pip_requirements()
    for pkg in ("vbench", "decord", "opencv-python-headless", "easydict"):
        assert pkg in makefile, pkg
        assert pkg in conda, pkg
