"""The notebooks execute headless (nbclient, the venv's python3 kernel) on a small real results store."""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


@pytest.mark.parametrize("name", ["attention_mass.ipynb", "tradeoff.ipynb"])
def test_notebook_runs_and_draws(name, results_store, monkeypatch):
    results = results_store
    monkeypatch.setenv("JENSENKV_RESULTS", str(results))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()  # raises on any cell error
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, f"{name} drew nothing"
    text = "".join(o.get("text", "") for o in outputs)
    assert f"finished runs under {results.resolve()}" in text  # it read the fixture, not the repo's results/


def _execute(name: str, results: Path, monkeypatch) -> list[dict]:
    monkeypatch.setenv("JENSENKV_RESULTS", str(results))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()  # raises on any cell error
    return [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]


@pytest.mark.parametrize("name", ["attention_mass.ipynb", "tradeoff.ipynb"])
def test_notebook_on_a_fresh_clone_says_there_are_no_runs_yet(name, tmp_path, monkeypatch):
    outputs = _execute(name, tmp_path / "results", monkeypatch)  # no results/ at all, as after `git clone`
    text = "".join(o.get("text", "") for o in outputs)
    assert "no finished runs yet" in text and "python -m jensenkv.run -m experiment=" in text
