"""Readiness: whether a model, metric or VBench dimension can run on this machine, and what is missing where.

The families (``jensenkv.models``) and the evaluators (``jensenkv.eval.readiness``) each describe their own
files and packages as ``Check``s; a run's pre-flight (``jensenkv.config.resolve``) and the report of
``python -m jensenkv.doctor`` read the same checks. Nothing here knows a model or a metric.
"""
from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

FETCH = "run `make fetch-weights` on a machine with internet (then copy the caches here if needed)"
SETUP = "run `make setup` (it installs VBench's scorer packages)"


class NotReadyError(FileNotFoundError):
    """A requested model or metric cannot run here (weights or packages missing); the message says what to do."""


@dataclass
class Check:
    """The readiness of one model, metric or VBench dimension."""

    name: str  # e.g. "model skyreels_v2_df_1_3b", "metric lpips", "vbench subject_consistency"
    files: list[tuple[Path, bool]] = field(default_factory=list)  # (exact path looked in, present)
    modules: list[tuple[str, str, str | None]] = field(default_factory=list)  # (module, pip name, import error)
    notes: list[str] = field(default_factory=list)  # reasons that are neither a file nor a module
    terms: list[str] = field(default_factory=list)  # conditions of use shown with it (a licence): not a reason

    @property
    def ready(self) -> bool:
        return all(ok for _, ok in self.files) and all(err is None for *_, err in self.modules) and not self.notes

    def problem(self) -> str:
        """What is wrong, in one clause ("" when ready)."""
        parts = [f"missing {path}" for path, ok in self.files if not ok]
        parts += [f"module {m} does not import ({pip}: {err})" for m, pip, err in self.modules if err is not None]
        return "; ".join(parts + self.notes)

    def fix(self) -> str:
        fixes = []
        if any(not ok for _, ok in self.files):
            fixes.append(FETCH)
        if any(err is not None for *_, err in self.modules):
            fixes.append(SETUP)
        return " and ".join(fixes)


def import_error(module: str) -> str | None:
    """None if ``module`` imports, else the error as one line."""
    try:
        importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any failure means the code that imports it cannot run
        return f"{type(e).__name__}: {e}".splitlines()[0]
    return None


def module_checks(pairs: Sequence[tuple[str, str]]) -> list[tuple[str, str, str | None]]:
    """(module, pip requirement) pairs as Check.modules entries."""
    return [(module, pip, import_error(module)) for module, pip in pairs]


def require(checks: Sequence[Check]) -> None:
    """Raise NotReadyError (one line: what is missing, what to do) unless every check is ready."""
    failed = [c for c in checks if not c.ready]
    if failed:
        fixes = " and ".join(dict.fromkeys(f for c in failed for f in c.fix().split(" and ") if f))
        raise NotReadyError(
            "not ready: " + " | ".join(f"{c.name}: {c.problem()}" for c in failed)
            + f". To fix: {fixes or 'see the reasons'}; or drop them from eval.metrics / eval.vbench.dimensions."
            " `make check-weights` lists every path")
