"""Where a report's files go, and how: the one rule every report and figure writer follows.

- **Committed or partial.** The committed outputs under the results dir (table1.*, claims.md, figures/*.png)
  are written only from a store that holds the full experiment they describe. A report names what its
  experiment lacks (its ``gaps``); with any gap, its files go to ``<out>/partial/`` instead, beside
  ``<out>/partial/<report>.why.txt``: one line saying which runs or cells are missing. The committed files stay
  byte-identical.
- **All or none.** A report builds every file first, into a temporary folder beside its destination; only
  when all of them are built are they moved into place (``os.replace``, each file atomic). A report that fails
  halfway writes none of its files.
- **One flag.** Every report command reads the store named by ``--results`` (default: ``$JENSENKV_RESULTS``,
  else ``results``, as the runs' ``paths.results_dir``) and writes under ``--out`` (default: ``--results``).
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PARTIAL = "partial"  # <out>/partial/: what an incomplete store produced (`make clean` removes it)
RESULTS_ENV = "JENSENKV_RESULTS"  # the runs' variable (config.py: paths.results_dir)
PROJECT = Path(__file__).resolve().parents[3]  # src/jensenkv/report/publish.py -> the checkout

Writer = Callable[[Path], None]  # writes one file at the path it is given


def default_results() -> str:
    """The results dir a report reads when not told: ``$JENSENKV_RESULTS``, else ``results`` (as the runs)."""
    return os.environ.get(RESULTS_ENV) or "results"


def add_store_args(parser: argparse.ArgumentParser, out_help: str) -> None:
    """``--results`` and ``--out``, the same name and default on every report command."""
    parser.add_argument("--results", default=default_results(),
                        help=f"results dir with runs/ (default: ${RESULTS_ENV}, else results)")
    parser.add_argument("--results-dir", dest="results", help=argparse.SUPPRESS)  # deprecated spelling
    parser.add_argument("--out", default=None, help=out_help + " (default: --results); an incomplete store's "
                        f"files go to <out>/{PARTIAL}/")


@dataclass
class Part:
    """Files of one report that stand or fall together: ``files`` {path relative to out: writer}, written to
    ``out`` when ``gaps`` is empty, else to ``out/partial``."""

    name: str
    files: dict[str, Writer]
    gaps: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.gaps

    @property
    def why(self) -> str:
        """The one line ``<report>.why.txt`` holds: what the store lacks for the committed files."""
        return f"{self.name} is incomplete, missing: {'; '.join(self.gaps)}"


@dataclass
class Published:
    """Where each file of a report went."""

    paths: dict[str, Path] = field(default_factory=dict)  # relative name -> written path
    incomplete: dict[str, str] = field(default_factory=dict)  # part -> its why line

    @property
    def complete(self) -> bool:
        return not self.incomplete


def destination(out: Path, part: Part, allow_incomplete: bool = False) -> Path:
    return out if part.complete or allow_incomplete else out / PARTIAL


def publish(out: str | Path, parts: Sequence[Part], allow_incomplete: bool = False) -> Published:
    """Build every part's files in one temporary folder under ``out``, then move each into its destination
    (``destination``); an exception while building leaves every destination as it was."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(out)
    staging = Path(tempfile.mkdtemp(dir=out, prefix=".report.", suffix=".tmp"))
    try:
        moves: list[tuple[Path, Path, str]] = []  # (built file, destination, relative name)
        for i, part in enumerate(parts):
            folder = destination(out, part, allow_incomplete)
            files = dict(part.files)
            if not part.complete and not allow_incomplete:
                files[f"{part.name}.why.txt"] = lambda path, p=part: path.write_text(p.why + "\n")
            for rel, write in files.items():
                built = staging / str(i) / rel
                built.parent.mkdir(parents=True, exist_ok=True)
                write(built)
                moves.append((built, folder / rel, rel))
        published = Published()
        for built, final, rel in moves:
            final.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(built, 0o666 & ~_umask())
            os.replace(built, final)
            published.paths[rel] = final
        published.incomplete = {p.name: p.why for p in parts if not p.complete}
        return published
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def remove_stale_staging(out: Path) -> list[Path]:
    """Remove staging folders a killed report left in ``out``: those untouched for longer than the lock's stale
    limit (a live report's folder is minutes old at most)."""
    import time

    from jensenkv.tracking import lock_stale_after_s

    limit = time.time() - lock_stale_after_s()
    removed = []
    for folder in out.glob(".report.*.tmp"):
        try:
            if folder.is_dir() and folder.stat().st_mtime < limit:
                shutil.rmtree(folder)
                removed.append(folder)
        except OSError:  # best effort: a folder another process removes first, or a read-only store
            continue
    return removed


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def text_file(text: str) -> Writer:
    return lambda path: path.write_text(text)


def shown_path(path: str | Path) -> str:
    """A results dir as a report may write it: ``$JENSENKV_RESULTS`` when it came from that variable, else
    relative to the project (``results``, ``../store``): never this machine's absolute path."""
    resolved = Path(path).resolve()
    from_env = os.environ.get(RESULTS_ENV)
    if from_env and resolved == Path(from_env).resolve():
        return f"${RESULTS_ENV}"
    return os.path.relpath(resolved, PROJECT)
