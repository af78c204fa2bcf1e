"""Where a report's files go, and how: the one rule every report and figure writer follows.

- **Committed or partial.** The committed outputs under the results dir (table1.*, claims.md, figures/*.png)
  are written only from a store that holds the full experiment they describe. A report names what its
  experiment lacks (its ``gaps``); with any gap, its files go to ``<out>/partial/`` instead, beside
  ``<out>/partial/<report>.why.txt``: one line saying which runs or cells are missing. The committed files stay
  byte-identical.
- **All or none, even under kill -9.** A report builds every file first, into ``<out>/.publish/``; only when
  all of them are built does it write ``.publish/journal.json`` (one ``os.replace``: the commit point), which
  names every move; then it moves the files into place and removes the folder. Before any report reads or
  writes ``<out>`` (``recover``), a journal left by a killed report is finished (its moves redone: the set is
  all new) and a folder without one is removed (it never committed: the set is all old). One report publishes
  into an out dir at a time (``.publish.lock``, an OS lock the kernel frees when its holder dies), so whatever
  the next one finds there belongs to a dead process.
- **One flag.** Every report command reads the store named by ``--results`` (default: ``$JENSENKV_RESULTS``,
  else ``results``, as the runs' ``paths.results_dir``) and writes under ``--out`` (default: ``--results``).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

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
    """Build every part's files in ``<out>/.publish/``, commit (the journal), then move each into its
    destination (``destination``); an exception or a kill before the commit leaves every destination as it was,
    one after it leaves the whole new set (the next report finishes the moves)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with _publishing(out):
        _say(out, _recover(out))
        staging = out / STAGING
        staging.mkdir()
        try:
            moves = _build(staging, out, parts, allow_incomplete)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        _commit(staging, moves)
        _finish(out)
    published = Published(incomplete={p.name: p.why for p in parts if not p.complete})
    published.paths = {rel: out / final for _, final, rel in moves}
    return published


STAGING = ".publish"  # <out>/.publish/: the files being built; with journal.json once all are
JOURNAL = "journal.json"  # [[built, final], ...], relative to .publish/ and to out: written last, atomically
LOCK = ".publish.lock"  # one publisher per out dir
LEGACY_STAGING = ".report.*.tmp"  # staging folders of earlier versions: never committed


def _build(staging: Path, out: Path, parts: Sequence[Part], allow_incomplete: bool) -> list[tuple[str, str, str]]:
    """Write every file under ``staging``: [(built, final, relative name)], built relative to ``staging``,
    final relative to ``out``."""
    moves = []
    for i, part in enumerate(parts):
        folder = destination(Path(), part, allow_incomplete)
        files = dict(part.files)
        if not part.complete and not allow_incomplete:
            files[f"{part.name}.why.txt"] = lambda path, p=part: path.write_text(p.why + "\n")
        for rel, write in files.items():
            built = staging / str(i) / rel
            built.parent.mkdir(parents=True, exist_ok=True)
            write(built)
            os.chmod(built, 0o666 & ~_umask())
            moves.append((str(built.relative_to(staging)), str(folder / rel), rel))
    return moves


def _commit(staging: Path, moves: list[tuple[str, str, str]]) -> None:
    """The commit point: the journal appears whole (``os.replace``) only once every file is built."""
    pending = staging / f"{JOURNAL}.tmp"
    pending.write_text(json.dumps([[built, final] for built, final, _ in moves]))
    os.replace(pending, staging / JOURNAL)


def _finish(out: Path) -> None:
    """Do the journal's moves (those not done yet: each ``os.replace`` is atomic, a file is either still
    built or already in place), then remove the staging folder, journal first."""
    staging = out / STAGING
    for built, final in json.loads((staging / JOURNAL).read_text()):
        if (staging / built).exists():
            (out / final).parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / built, out / final)
    (staging / JOURNAL).unlink()
    shutil.rmtree(staging)


def _recover(out: Path) -> str:
    """Under the lock: finish a committed publish a killed report left, remove one that never committed.
    Returns what was done ("" when nothing was left)."""
    done = ""
    if (out / STAGING / JOURNAL).is_file():
        _finish(out)
        done = "finished the publish a killed report had committed"
    leftovers = [p for p in (out / STAGING, *out.glob(LEGACY_STAGING)) if p.exists()]
    for folder in leftovers:
        shutil.rmtree(folder, ignore_errors=True)
    return done or ("removed the files of a killed report that never committed" if leftovers else "")


def recover(out: str | Path) -> str:
    """What every report does first, for its store and its out dir: finish or undo a publish a killed report
    left there, so nothing reads a mixed set. Free (no lock, no write) when nothing was left."""
    out = Path(out)
    if not (out / STAGING).exists() and not any(out.glob(LEGACY_STAGING)):
        return ""
    with _publishing(out):
        done = _recover(out)
    _say(out, done)
    return done


def recover_store(args: argparse.Namespace) -> None:
    """``recover`` a report command's ``--results`` and ``--out``: the first thing it does."""
    for folder in dict.fromkeys([args.results, args.out or args.results]):
        recover(folder)


def _say(out: Path, done: str) -> None:
    if done:
        print(f"{out}: {done}", file=sys.stderr, flush=True)


@contextmanager
def _publishing(out: Path) -> Iterator[None]:
    """Hold ``<out>/.publish.lock`` (waiting, with a message, while another report publishes there)."""
    import filelock

    lock = filelock.FileLock(str(out / LOCK))
    try:
        lock.acquire(timeout=5)
    except filelock.Timeout:
        print(f"waiting for another report publishing into {out} ({out / LOCK})", file=sys.stderr, flush=True)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


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


def report_error(error: Exception) -> NoReturn:
    """A report's one-line error and its status: a damaged store or a failed write 3, a bad flag or path 2."""
    from jensenkv.exit_codes import BAD_INPUT, FAILED, stop
    from jensenkv.store.llm import DamagedLlmRunError
    from jensenkv.store.record import CorruptRecordError

    damaged = isinstance(error, (CorruptRecordError, DamagedLlmRunError))
    failed = isinstance(error, OSError) and not isinstance(error, FileNotFoundError)
    stop(f"error: {error}", FAILED if damaged or failed else BAD_INPUT)
