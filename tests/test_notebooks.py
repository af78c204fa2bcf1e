"""The notebooks execute headless (nbclient, the venv's python3 kernel) on a small real results store holding
two models, and every figure shows one model, named in its title (``report.notebook.show`` prints the title
and the runs drawn)."""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from two_models import OTHER_MODEL, with_second_model

from jensenkv.report.model_choice import BUILT_IN_MODEL

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


@pytest.fixture(scope="module")
def two_models(results_store, tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The real store (the built-in model's runs) plus each run again as a second model."""
    root = tmp_path_factory.mktemp("two_models") / "results"
    return root, with_second_model(results_store, root)


def _execute(name: str, results: Path, monkeypatch, model: str | None = None) -> list[dict]:
    """Run a notebook on ``results`` (``model``: its MODEL parameter); its code cells' outputs."""
    monkeypatch.setenv("JENSENKV_RESULTS", str(results))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    if model is not None:
        (params,) = [c for c in notebook.cells if "parameters" in c.metadata.get("tags", [])]
        assert "MODEL = None" in params.source
        params.source = params.source.replace("MODEL = None", f"MODEL = {model!r}")
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()  # raises on any cell error
    return [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]


def _figures(outputs: list[dict]) -> tuple[list[str], list[str]]:
    """(the printed figure titles, the run ids the figures drew)."""
    lines = "".join(o.get("text", "") for o in outputs).splitlines()
    titles = [line.removeprefix("figure: ") for line in lines if line.startswith("figure: ")]
    runs = [r for line in lines if line.startswith("  runs: ") for r in line.removeprefix("  runs: ").split(", ")]
    return titles, runs


@pytest.mark.parametrize("name", ["attention_mass.ipynb", "tradeoff.ipynb"])
def test_each_figure_shows_one_model_named_in_its_title(name, two_models, monkeypatch):
    results, copies = two_models
    outputs = _execute(name, results, monkeypatch)
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert [o for o in outputs if "image/png" in o.get("data", {})], f"{name} drew nothing"
    text = "".join(o.get("text", "") for o in outputs)
    assert f"finished runs under {results.resolve()}" in text  # it read the fixture, not the repo's results/
    # MODEL = None: the built-in model, although the other sorts first
    assert f"models in the store: {sorted([OTHER_MODEL, BUILT_IN_MODEL])}; showing {BUILT_IN_MODEL!r}" in text
    titles, runs = _figures(outputs)
    assert titles and all(t.startswith(f"{BUILT_IN_MODEL}: ") for t in titles), titles
    assert runs and not [r for r in runs if r in copies], runs  # no run of the other model


def test_the_model_parameter_shows_the_other_model(tmp_path, monkeypatch):
    """diagnostics.ipynb with MODEL set, on test_claims' synthetic store (probes with the error-model
    diagnostics) written once per model."""
    from test_claims import build_store

    for name in (OTHER_MODEL, BUILT_IN_MODEL):
        build_store(tmp_path / "results", model=name)
    from jensenkv.report.store_frame import load_results

    table = load_results(tmp_path / "results")
    other = set(table.loc[table["model"] == OTHER_MODEL, "run_id"])
    outputs = _execute("diagnostics.ipynb", tmp_path / "results", monkeypatch, model=OTHER_MODEL)
    text = "".join(o.get("text", "") for o in outputs)
    assert f"showing {OTHER_MODEL!r}" in text
    titles, runs = _figures(outputs)
    assert len(titles) == 2 and all(t.startswith(f"{OTHER_MODEL}: ") for t in titles), titles
    assert runs and all(r in other for r in runs), runs


@pytest.mark.parametrize("name", ["attention_mass.ipynb", "tradeoff.ipynb"])
def test_notebook_on_a_fresh_clone_says_there_are_no_runs_yet(name, tmp_path, monkeypatch):
    outputs = _execute(name, tmp_path / "results", monkeypatch)  # no results/ at all, as after `git clone`
    text = "".join(o.get("text", "") for o in outputs)
    assert "no finished runs yet" in text and "python -m jensenkv.run -m experiment=" in text


def test_choose_model():
    import pandas as pd

    from jensenkv.report.model_choice import choose_model

    both = pd.DataFrame({"model": ["zeta", BUILT_IN_MODEL, "alpha", None]})
    assert choose_model(both) == BUILT_IN_MODEL  # the built-in model first, whatever the order
    assert choose_model(pd.DataFrame({"model": ["zeta", "alpha"]})) == "alpha"  # else the first, sorted
    assert choose_model(both, "zeta") == "zeta"
    assert choose_model(pd.DataFrame()) is None
    with pytest.raises(ValueError, match=r"MODEL='nope' is not allowed: use one of the models with runs in the "
                                         r"store: \['alpha', 'tiny', 'zeta'\]"):
        choose_model(both, "nope", key="MODEL")
