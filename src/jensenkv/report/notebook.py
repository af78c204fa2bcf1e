"""What the notebooks share, so they stay thin: the results store they read, the one model they show
(``report.model_choice``), and figures shown with their title printed (a reader of the saved notebook, and
its test, sees which model each figure is of)."""
from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from jensenkv.report.model_choice import choose_model, store_models
from jensenkv.report.store_frame import load_results


def results_dir() -> Path:
    """$JENSENKV_RESULTS, else ../results when run from notebooks/, else ./results."""
    if os.environ.get("JENSENKV_RESULTS"):
        return Path(os.environ["JENSENKV_RESULTS"])
    return Path("..") / "results" if Path.cwd().name == "notebooks" else Path("results")


@dataclass
class Store:
    """The results directory, the one model shown (None: no runs yet) and that model's finished runs."""

    results: Path
    model: str | None
    runs: pd.DataFrame


def open_store(model: str | None = None, first_run: str = "make reproduce-table1") -> Store:
    """Read the store, print how many runs it has and of which models, and choose the one model to show
    (``model``: the notebook's MODEL parameter). ``first_run``: the command a fresh clone runs first."""
    results = results_dir()
    runs = load_results(results)
    print(f"{len(runs)} finished runs under {results.resolve()}")
    if runs.empty:
        print(f"no finished runs yet under {results.resolve()}: run `{first_run}` (or `make reproduce-table1`) "
              "first; the cells below then draw them")
        return Store(results, None, runs)
    chosen = choose_model(runs, model, key="MODEL")
    print(f"models in the store: {store_models(runs)}; showing {chosen!r} (set MODEL in the first cell to change)")
    return Store(results, chosen, runs[runs["model"] == chosen])


def show(fig: Figure, run_ids: Iterable[str] = ()) -> None:
    """Show a figure, printing its title (the suptitle, else the first panel's) and the runs it draws."""
    import matplotlib.pyplot as plt

    title = fig.get_suptitle() or next((ax.get_title() for ax in fig.axes if ax.get_title()), "")
    print(f"figure: {title}")
    ids = list(dict.fromkeys(str(r) for r in run_ids))
    if ids:
        print(f"  runs: {', '.join(ids)}")
    plt.show()
