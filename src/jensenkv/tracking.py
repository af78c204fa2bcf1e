"""Where runs leave their results: the local results store (one JSON record per run) and W&B.

Layout under the results directory (``paths.results_dir``, default ``results/``)::

    runs/<run_id>/record.json       the run's record (written last, atomically: its presence = run done)
    runs/<run_id>/prompts/<i>.json   per-prompt results (lets an interrupted run resume)
    runs/<run_id>/attention.csv      probe statistics per (prompt, layer, step, chunk, branch)
    runs/<run_id>/videos/*.mp4       the run's videos
    runs/<run_id>/wandb.json         written once the record is logged to W&B (absent: a rerun logs it)
    runs/<run_id>/error.json         the run's last failure (sweep summaries report it)
    runs/<run_id>/.lock, .tmp/       the lease of the process running it; files being written
    refs/<ref_id>.pt                 BF16 reference videos, shared by every run of the same model/prompt/seed
    wandb/                           offline W&B runs (``wandb sync results/wandb/wandb/offline-run-*``)

A record is checked against its run id and the content digests of itself and of every file of its run whenever
it is read (``jensenkv.record_check``): a damaged one counts as unfinished, so the rerun regenerates it, and stops
load_results with one line naming it.

Every file is written to a temporary file in the same directory and moved into place with
``os.replace``, so a crash never leaves a half-written record behind; what a killed writer leaves is removed
by the next process that takes the run's lock, or by the next run of it once no live writer can own it
(``ResultsStore.remove_leftovers``).
"""
from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:  # pandas is imported where a table is built: `import jensenkv.config` stays light
    import pandas as pd

from jensenkv.hashing import config_hash  # noqa: F401 - re-exported: run ids are made here
from jensenkv.record_check import (ATTENTION_FILE, DIGEST, RECORD_SCHEMA, CorruptRecordError,  # noqa: F401
                                   DamagedRunError, DamagedStoreError, check_record, check_side_files,
                                   content_digest, file_sha256, read_attention, side_file_entry)

INTEGER_COLUMNS = ("bits", "group_size", "sink_chunks", "window_chunks", "num_prompts")
RECORD_FILE = "record.json"
WANDB_MARKER = "wandb.json"    # written once the run's W&B run is complete; its absence = log again
ERROR_FILE = "error.json"      # the last failure of a run (what a sweep summary reports)
TMP_DIR = ".tmp"               # a run's temporary files: never inside videos/, which VBench scores whole

log = logging.getLogger("jensenkv.tracking")


class ResultsWriteError(ValueError):
    """The results directory cannot be written (read-only, full, a file in the way): one line, no traceback."""


class LockError(ResultsWriteError):
    """A lock that can never be taken (its file cannot be read or created): one line instead of a wait."""


WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST,
                errno.EISDIR)


def describe_write_error(error: OSError, root: str | os.PathLike, key: str = "paths.results_dir") -> str:
    """One line saying why writing under the folder ``root`` (set by ``key``) failed and what to do."""
    where = error.filename or root
    setting = f"{key}={str(root)!r}"
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left on the device (or quota) writing {where}: free space or point {setting} elsewhere"
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        what = "the results directory" if key == "paths.results_dir" else "that folder"
        return f"cannot write {where}: {what} is read-only; point {setting} at a writable folder"
    if error.errno in (errno.ENOTDIR, errno.EEXIST, errno.EISDIR):
        return f"{setting} must be a directory, but a file is in the way at {where}"
    return f"cannot write {where} ({error.strerror or error}); check {setting}"


# --- atomic writes -----------------------------------------------------------------------------------
def atomic_write(path: str | os.PathLike, write: Callable[[Any], None], mode: str = "wb") -> Path:
    """Call ``write(file)`` on a temporary file next to ``path``, then ``os.replace`` it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp creates 0600: results are shared files
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def check_output_file(path: str | os.PathLike, setting: str) -> None:
    """Fail in one line naming ``setting`` when ``path`` cannot be written: it is a folder, a file is in the way
    of its folder, or its nearest existing folder refuses a new file (checked before any heavy work)."""
    from jensenkv.checks import fail

    path = Path(path)
    if path.is_dir():
        fail(setting, str(path), "it is a folder: give a file path")
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        fail(setting, str(path), f"{folder} is a file, not a folder: give a path in a writable folder")
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".probe.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        fail(setting, str(path), f"its folder {folder} cannot be written ({e.strerror or e}): give a path in a "
                                 "writable folder")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def tmp_files(folder: Path) -> list[Path]:
    """Temporary files under ``folder``: ``atomic_write``'s ``.*.tmp``, the ``.tmp/`` folder and older
    ``videos/.*.tmp.mp4``."""
    if not folder.is_dir():
        return []
    found = [*folder.rglob(".*.tmp"), *folder.rglob(".*.tmp.mp4"), *folder.glob(f"{TMP_DIR}/**/*")]
    return [path for path in found if path.is_file()]


def remove_tmp_files(folder: Path, keep: Callable[[Path], bool] = lambda p: False) -> list[Path]:
    """Delete temporary files left by killed writers under ``folder`` (call it while holding the folder's
    lock)."""
    removed = []
    for path in tmp_files(folder):
        if not keep(path):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def portable(text: str) -> str:
    """A message or path without this machine's absolute paths: the project as ./, the home as ~."""
    import re

    for root, short in ((str(Path(__file__).resolve().parents[2]), "."), (str(Path.home()), "~")):
        if root not in ("", os.sep):
            text = re.sub(re.escape(root) + r"(?![\w.-])", short, text)
    return text


def portable_json(obj: Any) -> Any:
    """``portable`` applied to every string of a JSON-like object."""
    if isinstance(obj, str):
        return portable(obj)
    if isinstance(obj, Mapping):
        return {k: portable_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [portable_json(v) for v in obj]
    return obj


def _json_safe(obj: Any) -> Any:
    """NaN/inf are not JSON: store them as null (a metric that is not a number is missing)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Mapping):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def sealed(obj: Mapping[str, Any]) -> dict:
    """``obj`` as it will read back from JSON, with its content digest (``record_check.content_digest``)."""
    safe = _json_safe(obj)
    return {**safe, DIGEST: content_digest(safe)}


def run_files(run_dir: Path) -> dict[str, dict]:
    """Every file of a finished run but its record, by path inside the run's folder: its bytes and sha256.
    Left out: hidden files (locks, temporary files) and the marks written after the record (W&B, errors)."""
    out = {}
    for path in sorted(run_dir.rglob("*")):
        name = path.relative_to(run_dir).as_posix()
        if path.is_file() and not any(part.startswith(".") for part in name.split("/")) and \
                name not in (RECORD_FILE, WANDB_MARKER, ERROR_FILE):
            out[name] = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
    return out


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    text = json.dumps(_json_safe(obj), indent=2, sort_keys=True, allow_nan=False)
    return atomic_write(path, lambda f: f.write(text), mode="w")


def read_json(path: str | os.PathLike) -> Any:
    """Read a JSON file; a damaged one raises CorruptRecordError naming it."""
    path = Path(path)
    try:
        with open(path) as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CorruptRecordError(
            f"results file {path} is corrupted ({type(e).__name__}: {e}); fix or remove it by hand "
            "(nothing was deleted) and rerun to regenerate it"
        ) from e


# --- locks: one process per run / per reference ------------------------------------------------------
LOCK_STALE_ENV = "JENSENKV_LOCK_STALE_S"
DEFAULT_LOCK_STALE_S = 120.0
UNREADABLE_GRACE_S = 5.0  # an empty / garbled lock younger than this may be mid-write by its creator


def lock_stale_after_s() -> float:
    """Seconds without a heartbeat after which a lock is taken over, whoever holds it
    ($JENSENKV_LOCK_STALE_S, default 120; the holder renews it every quarter of that)."""
    raw = os.environ.get(LOCK_STALE_ENV)
    if raw is None:
        return DEFAULT_LOCK_STALE_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or not math.isfinite(value):
        raise ValueError(f"{LOCK_STALE_ENV}={raw!r} is not allowed: must be a number of seconds > 0")
    return value


def _process_started(pid: int) -> float | None:
    """Start time (epoch s) of a live process on this host; None if it is gone (zombies count as gone)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc.create_time()
    except (psutil.NoSuchProcess, ValueError):
        return None
    except psutil.AccessDenied:
        return float("nan")  # alive, start time unknown


def probe_writable(folder: str | os.PathLike) -> None:
    """Create ``folder`` and write then remove a temporary file in it: OSError when it cannot be written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    fd, probe = tempfile.mkstemp(dir=folder, prefix=".probe.", suffix=".tmp")
    os.close(fd)
    os.unlink(probe)


class FileLock:
    """A lease on a lock file, so parallel sweep jobs (local or SLURM, on any host) never do the same work.

    The lock file holds {host, pid, pid_started, started, heartbeat, token}; a thread renews the heartbeat
    every ``heartbeat_s``. A lock is stale, and taken over with a message, when it is empty or garbled (and
    older than a few seconds), when its process on this host is gone or its PID now belongs to another
    process, or when it had no heartbeat for ``stale_after_s``, whatever its PID says (a preempted SLURM job,
    a dead node, a hung or suspended process, a reused PID without a start time): every wait for a lock ends
    within ``stale_after_s`` of its holder's last beat. A lock file that cannot be read or created raises
    LockError (one line) instead of waiting. Check-and-take-over runs under an OS lock (``filelock``,
    released by the kernel when its holder dies), so two processes never both take over the same stale lock.
    A holder that finds its lease taken sets ``lost`` and stops renewing it.
    """

    def __init__(self, path: str | os.PathLike, stale_after_s: float | None = None,
                 heartbeat_s: float | None = None, guard: str | os.PathLike | None = None):
        self.path = Path(path)
        self.guard_path = Path(guard) if guard is not None else Path(f"{self.path}.guard")  # never deleted
        self.stale_after_s = float(stale_after_s) if stale_after_s is not None else lock_stale_after_s()
        self.heartbeat_s = float(heartbeat_s) if heartbeat_s is not None else self.stale_after_s / 4
        self.held = False
        self.lost = False
        self._token: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the guard: serialises every check-and-write of the lock file --------------------------------
    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        import filelock

        timeout = max(30.0, self.stale_after_s)  # held a few ms at a time: a longer wait is a fault
        try:
            self.guard_path.parent.mkdir(parents=True, exist_ok=True)
            guard = filelock.FileLock(str(self.guard_path), timeout=timeout)
            guard.acquire()
        except filelock.Timeout:
            raise LockError(f"the lock guard {self.guard_path} was not free within {timeout:.0f}s: a process "
                            "holding it is hung; end it or remove the file") from None
        except OSError as e:
            raise LockError(f"the lock guard {self.guard_path} cannot be used ({e.strerror or e}): "
                            "fix or remove it, or point paths.results_dir elsewhere") from None
        try:
            yield
        finally:
            guard.release()

    def _read(self) -> tuple[dict | None, float | None]:
        """(holder or None if empty/garbled, file mtime); (None, None) when there is no lock file."""
        try:
            mtime = self.path.stat().st_mtime
            text = self.path.read_text()
        except (FileNotFoundError, NotADirectoryError):  # no lock file (can) exist there
            return None, None
        except OSError as e:  # a folder or an unreadable file: no holder will ever release it
            raise LockError(f"the lock file {self.path} cannot be read ({e.strerror or e}): remove it by hand "
                            "(nothing else is deleted) and rerun") from None
        try:
            holder = json.loads(text)
        except json.JSONDecodeError:
            return None, mtime
        return (holder if isinstance(holder, dict) else None), mtime

    def stale_reason(self, holder: dict | None, mtime: float) -> str | None:
        """Why a lock file with this content is stale, or None if its holder must be presumed live."""
        now = time.time()
        if holder is None:
            age = now - mtime
            return f"the lock file is empty or unreadable and {age:.0f}s old" if age > UNREADABLE_GRACE_S else None
        beat = holder.get("heartbeat")
        beat = float(beat) if isinstance(beat, (int, float)) else mtime  # older lock files: their mtime
        if holder.get("host") == socket.gethostname():
            try:
                pid = int(holder["pid"])
            except (KeyError, TypeError, ValueError):
                pid = None
            if pid is not None:
                started = _process_started(pid)
                if started is None:
                    return f"its process {pid} on this host is gone"
                recorded = holder.get("pid_started")
                if isinstance(recorded, (int, float)) and math.isfinite(started) and abs(started - recorded) > 1.0:
                    return f"PID {pid} now belongs to another process (started at {started:.0f}, not {recorded:.0f})"
        if now - beat > self.stale_after_s:  # a live PID too: its holder renews the lease every heartbeat_s
            return f"no heartbeat for {now - beat:.0f}s (> {self.stale_after_s:g}s)"
        return None

    def _lease(self, started: float) -> dict:
        return {"host": self._host, "pid": os.getpid(), "pid_started": _process_started(os.getpid()),
                "started": started, "heartbeat": time.time(), "token": self._token}

    def try_acquire(self) -> bool:
        """Take the lock if free (or stale, with a message); False if a live holder has it."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise self._cannot_create(e) from None
        with self._guard():
            holder, mtime = self._read()
            if mtime is not None:
                reason = self.stale_reason(holder, mtime)
                if reason is None:
                    return False
                log.warning("taking over stale lock %s (%s): %s", self.path, self._describe(holder), reason)
                self.path.unlink(missing_ok=True)
            self._token, self._host = uuid.uuid4().hex, socket.gethostname()
            now = time.time()
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
            except FileExistsError:  # a process that does not use the guard got there first
                return False
            except OSError as e:
                raise self._cannot_create(e) from None
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(self._lease(now), f)
            except BaseException:
                self.path.unlink(missing_ok=True)
                raise
            self._started = now
        self.held, self.lost = True, False
        self._stop.clear()
        self._thread = threading.Thread(target=self._heartbeat, name=f"lease {self.path.name}", daemon=True)
        self._thread.start()
        return True

    def _cannot_create(self, error: OSError) -> LockError:
        return LockError(f"the lock file {self.path} cannot be created ({error.strerror or error}): a file is in "
                         "the way or the folder is read-only; check paths.results_dir")

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                with self._guard():
                    holder, _ = self._read()
                    if not holder or holder.get("token") != self._token:
                        self.lost = True
                        log.warning("lost the lock %s (now %s): another process took it over",
                                    self.path, self._describe(holder))
                        return
                    atomic_write_json(self.path, self._lease(self._started))
            except Exception as e:  # noqa: BLE001 - a missed beat is retried; the lease lasts stale_after_s
                log.warning("could not renew the lock %s: %s", self.path, e)

    def acquire(self, poll_s: float = 0.5, message_every_s: float = 30.0) -> None:
        """Wait until the lock is ours, saying who holds it while waiting."""
        last = None
        while not self.try_acquire():
            now = time.monotonic()
            if last is None or now - last >= message_every_s:
                log.warning("waiting for %s", self.describe_holder())
                last = now
            time.sleep(poll_s)

    def wait_released(self, poll_s: float = 0.5, message_every_s: float = 30.0) -> None:
        """Wait (saying so) until nobody live holds the lock; does not take it."""
        last = None
        while True:
            holder, mtime = self._read()
            if mtime is None or self.stale_reason(holder, mtime) is not None:
                return
            now = time.monotonic()
            if last is None or now - last >= message_every_s:
                log.warning("waiting for %s", self.describe_holder())
                last = now
            time.sleep(poll_s)

    def is_held_elsewhere(self) -> bool:
        """True when a live holder other than this object has the lock."""
        holder, mtime = self._read()
        if mtime is None or self.stale_reason(holder, mtime) is not None:
            return False
        return not (self.held and holder is not None and holder.get("token") == self._token)

    def _describe(self, holder: dict | None) -> str:
        if not holder:
            return "holder unknown"
        text = f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}"
        beat = holder.get("heartbeat")
        if isinstance(beat, (int, float)):
            text += f", last heartbeat {time.time() - beat:.0f}s ago"
        return text

    def describe_holder(self) -> str:
        holder, _ = self._read()
        return (f"{self._describe(holder)} (lock file {self.path}; taken over if that process dies or "
                f"stops its heartbeat for {self.stale_after_s:g}s)")

    def release(self) -> None:
        if not self.held:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.held = False
        with self._guard():
            holder, _ = self._read()
            if holder and holder.get("token") == self._token:  # never remove a lock another took over
                self.path.unlink(missing_ok=True)

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# --- the local results store -------------------------------------------------------------------------
# attention.csv verdicts of ResultsStore.damage, by the stat of a run's record and attention.csv: any rewrite
# changes the key.
_DAMAGE_VERDICTS: dict[tuple, None] = {}  # the sound ones
_DAMAGE_VERDICTS_KEPT = 4096


def _damage_key(run_dir: Path) -> tuple | None:
    """(run dir, stat of record.json, stat of attention.csv or None); None when the run has no record."""
    def stat(path: Path) -> tuple | None:
        try:
            st = path.stat()
        except (FileNotFoundError, NotADirectoryError):  # as Path.exists(): a file where a folder belongs
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns

    record = stat(run_dir / RECORD_FILE)
    return None if record is None else (str(run_dir), record, stat(run_dir / ATTENTION_FILE))


class ResultsStore:
    """The results directory: run records, per-prompt partial results and BF16 references."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs"

    @property
    def refs_dir(self) -> Path:
        return self.root / "refs"

    def run_dir(self, run_id: str) -> Path:
        return self.runs_dir / run_id

    def record_path(self, run_id: str) -> Path:
        return self.run_dir(run_id) / RECORD_FILE

    def has_record(self, run_id: str) -> bool:
        """True when the run finished and is sound; a damaged run counts as unfinished (``damage`` says why)."""
        return self.record_path(run_id).exists() and self.damage(run_id) is None

    def damage(self, run_id: str) -> DamagedRunError | None:
        """Why a finished run is damaged: its record and every file of its run checked against its run id and
        their digests (attention.csv also read whole); None when it is sound or has no record. attention.csv's
        verdict is kept while it and the record keep their stat, so a plan, its runner and its summary read it
        once."""
        key = _damage_key(self.run_dir(run_id))
        if key is None:  # no record
            return None
        try:
            record = self.read_record(run_id)  # every file's digest (hashed once while its stat holds)
            if key not in _DAMAGE_VERDICTS:
                read_attention(run_id, self.run_dir(run_id), record)
                if len(_DAMAGE_VERDICTS) >= _DAMAGE_VERDICTS_KEPT:
                    _DAMAGE_VERDICTS.clear()
                _DAMAGE_VERDICTS[key] = None
        except DamagedRunError as e:
            return e
        return None

    def read_record(self, run_id: str) -> dict:
        """The run's record, checked against its run id, its own digest and every listed file's (labels: those
        its identity gives): DamagedRunError naming the file and the field when it does not hold what the run id
        says; FileNotFoundError when there is none."""
        path = self.record_path(run_id)
        try:
            record = read_json(path)
        except CorruptRecordError as e:
            raise DamagedRunError(run_id, path, f"not JSON ({e.__cause__})") from None
        record = check_record(run_id, record, path)
        check_side_files(run_id, self.run_dir(run_id), record)
        return record

    def write_record(self, record: Mapping[str, Any]) -> Path:
        """Write a run's record last: with every file of its run (``run_files``, merged into the entries the
        record lists, such as attention.csv's rows) and its own content digest."""
        listed = record.get("files") or {}
        files = {name: {**listed.get(name, {}), **entry} for name, entry in run_files(self.run_dir(record["run_id"])).items()}
        return atomic_write_json(self.record_path(record["run_id"]),
                                 sealed({**record, "schema": RECORD_SCHEMA, "files": files}))

    def prompt_result_path(self, run_id: str, index: int) -> Path:
        return self.run_dir(run_id) / "prompts" / f"{index:04d}.json"

    def ref_path(self, ref_id: str) -> Path:
        return self.refs_dir / f"{ref_id}.pt"

    @property
    def guard_path(self) -> Path:
        """One OS lock file for the whole store, serialising lease checks (a few ms each)."""
        return self.root / ".locks.guard"

    def run_lock(self, run_id: str) -> FileLock:
        return FileLock(self.run_dir(run_id) / ".lock", guard=self.guard_path)

    def ref_lock(self, ref_id: str) -> FileLock:
        return FileLock(self.refs_dir / f".{ref_id}.lock", guard=self.guard_path)

    def tmp_dir(self, run_id: str) -> Path:
        """Where a run's files are encoded before being moved into place (outside videos/)."""
        return self.run_dir(run_id) / TMP_DIR

    def clean_run_tmp(self, run_id: str) -> list[Path]:
        """Remove what killed writers of this run left behind; call it holding the run's lock."""
        removed = remove_tmp_files(self.run_dir(run_id), keep=lambda p: p.name.startswith(".lock."))
        with contextlib.suppress(OSError):
            self.tmp_dir(run_id).rmdir()  # only when empty
        if removed:
            log.info("removed %d temporary file(s) left by an interrupted run %s", len(removed), run_id)
        return removed

    def remove_leftovers(self, run_id: str) -> list[Path]:
        """Remove what killed writers left around a run that no live writer can own, without taking its lock:
        temporary files in its folder and in refs/ (lock heartbeats, references) untouched for longer than the
        lock's stale limit, and an error.json beside a finished record. Best effort: a read-only store keeps
        them."""
        limit = time.time() - lock_stale_after_s()
        leftovers = [*tmp_files(self.run_dir(run_id)), *tmp_files(self.refs_dir)]
        if self.record_path(run_id).exists():
            leftovers.append(self.error_path(run_id))
        removed = []
        for path in leftovers:
            try:
                if path.name == ERROR_FILE or path.stat().st_mtime < limit:
                    path.unlink()
                    removed.append(path)
            except OSError:  # gone meanwhile, or a read-only store
                continue
        if removed:
            log.info("removed %d file(s) left by interrupted writers around run %s", len(removed), run_id)
        return removed

    def clean_ref_tmp(self, ref_id: str) -> None:
        """Remove half-written copies of one reference; call it holding the reference's lock."""
        for path in self.refs_dir.glob(f".{ref_id}.pt.*.tmp"):
            path.unlink(missing_ok=True)

    def wandb_marker_path(self, run_id: str) -> Path:
        return self.run_dir(run_id) / WANDB_MARKER

    def error_path(self, run_id: str) -> Path:
        return self.run_dir(run_id) / ERROR_FILE

    def check_writable(self, run_id: str) -> None:
        """Fail in one line, before any work, when the run's folder cannot be written."""
        try:
            probe_writable(self.run_dir(run_id))
        except OSError as e:
            raise ResultsWriteError(describe_write_error(e, self.root)) from None

    def iter_records(self) -> Iterator[dict]:
        """Every finished run's record, in run-id order; DamagedStoreError, naming each damaged run, if any."""
        records, damaged = [], []
        for path in sorted(self.runs_dir.glob(f"*/{RECORD_FILE}")) if self.runs_dir.is_dir() else []:
            try:
                records.append(self.read_record(path.parent.name))
            except DamagedRunError as e:
                damaged.append(e)
        if damaged:
            raise DamagedStoreError(damaged)
        yield from records


def record_row(record: Mapping[str, Any]) -> dict:
    """One flat DataFrame row: labels, metrics and ``<metric>_missing_reason`` columns."""
    row: dict[str, Any] = {"run_id": record["run_id"], "experiment_name": record.get("experiment_name")}
    row.update(record.get("labels", {}))
    row.update(record.get("metrics", {}))
    for metric, reason in record.get("missing", {}).items():
        row[f"{metric}_missing_reason"] = reason
    row["vbench_dimensions_used"] = ",".join(record.get("vbench_dimensions_used", []))
    row["num_prompts"] = len(record.get("per_prompt", []))
    row["created_at"] = record.get("created_at")
    row.update(comparison_columns(record.get("identity")))
    return row


# what a Table 1 cell compares (its treatment): everything else must be equal. "second_order": the b (1 - pi)
# term of attention.second_order; "calibration": the fitted strengths file of attention.calibration
COMPARED = ("correction", "strength", "second_order", "calibration")
QUANTIZER = ("key", "value")            # what distinguishes the rows of one table


def comparison_columns(identity: Mapping[str, Any] | None) -> dict:
    """Columns that say which runs may be compared: ``context`` (model and sampler settings, weights,
    prompts, seeds, cache layout, evaluators: equal for every run of one table or figure), ``setting``
    (the context plus the quantizer: equal for the two runs of one "none -> correction" cell), and a
    readable ``context_desc``."""
    if not identity:
        return {"context": "unknown", "setting": "unknown", "context_desc": "record without identity"}
    context = {k: v for k, v in identity.items() if k not in (*COMPARED, *QUANTIZER, "metrics")}
    context["full_precision_dtype"] = (identity.get("key") or {}).get("store_dtype")
    setting = {k: v for k, v in identity.items() if k not in (*COMPARED, "metrics")}
    model = identity.get("model") or {}
    generation = identity.get("generation") or {}
    sampler = {k: generation[k] for k in ("steps", "num_chunks", "frames_per_chunk", "shift", "guidance_scale",
                                          "sampler") if generation.get(k) is not None}
    prompts = identity.get("prompts") or []
    desc = (f"{len(prompts)} prompt(s) {config_hash(prompts, 6)}, seeds {identity.get('seeds')}, model "
            f"{model.get('name') or model.get('kind')} on {model.get('device')}"
            + (f" {sampler}" if sampler else "") + (f", weights {identity['weights']}" if identity.get("weights") else ""))
    return {"context": config_hash(context), "setting": config_hash(setting), "context_desc": desc}


def load_results(root: str | os.PathLike = "results") -> pd.DataFrame:
    """All finished runs under ``root`` as a DataFrame, one row per run (empty frame if there are none).

    Damaged runs raise DamagedStoreError, one line per run naming the file and the field: a table never
    silently drops or thins a run. Nothing is deleted.
    """
    import pandas as pd

    frame = pd.DataFrame([record_row(r) for r in ResultsStore(root).iter_records()])
    for col in INTEGER_COLUMNS:  # nullable integers: a bf16 run has no group size, but 32 must not read 32.0
        if col in frame.columns:
            frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("Int64")
    return frame


def load_attention(root: str | os.PathLike, run_id: str) -> pd.DataFrame:
    """The probe statistics of one run (one row per prompt, layer, step, chunk, branch), checked against its
    record (DamagedRunError); FileNotFoundError when the run has none."""
    store = ResultsStore(root)
    frame = read_attention(run_id, store.run_dir(run_id), store.read_record(run_id))
    if frame is None:
        raise FileNotFoundError(f"run {run_id} has no attention statistics ({store.run_dir(run_id) / ATTENTION_FILE});"
                                " run it with 'attention' in eval.metrics")
    return frame


# --- W&B ---------------------------------------------------------------------------------------------
WANDB_MODES = ("offline", "online", "disabled")


def check_wandb_mode(mode: str, key: str = "logger.mode", where: str = "") -> str:
    """``mode`` as W&B's mode ("dryrun" is "offline"); ValueError naming ``key`` if it is none of them."""
    mode = "offline" if mode == "dryrun" else mode
    if mode not in WANDB_MODES:
        raise ValueError(f"{key}={mode!r}{where} is not allowed: use one of {WANDB_MODES}")
    return mode


def resolve_wandb_mode(configured: str) -> str:
    """WANDB_MODE in the environment wins over the config (tests and CI set it to "disabled"). Read when a
    run logs and in the pre-check, never at import: a bad variable is one line, not a traceback."""
    if os.environ.get("WANDB_MODE"):
        return check_wandb_mode(os.environ["WANDB_MODE"], "WANDB_MODE", " (in the environment; it wins over logger.mode)")
    return check_wandb_mode(configured)


@dataclass
class LoggerConfig:
    """The logger node of the config tree: W&B. WANDB_MODE in the environment wins over ``mode`` (tests set
    WANDB_MODE=disabled)."""

    mode: str = "offline"              # offline | online | disabled (WANDB_MODE in the environment wins)
    project: str = "jensenkv"          # W&B project
    entity: Optional[str] = None       # W&B team or user (null: the login's default)
    dir: str = "${paths.results_dir}/wandb"  # where W&B writes its files
    tags: list[str] = field(default_factory=list)  # W&B tags of every run
    log_video: bool = True             # one sample video per run
    log_plots: bool = True             # attention-mass plot per run

    def __post_init__(self) -> None:
        check_wandb_mode(self.mode)  # the value alone: WANDB_MODE is read when a run logs (and pre-checked)


class WandbRun:
    """One W&B run per suite run: config, summary metrics, a sample video and plots.

    Offline runs land in ``<dir>/wandb/offline-run-*``; upload them later with ``wandb sync``.
    """

    @staticmethod
    def offline_runs(logger_cfg: Mapping[str, Any], wandb_id: str) -> list[Path]:
        """The offline run folders written for ``wandb_id`` (an interrupted one is removed before redoing it)."""
        return sorted((Path(logger_cfg.get("dir") or "wandb") / "wandb").glob(f"offline-run-*-{wandb_id}"))

    def __init__(self, logger_cfg: Mapping[str, Any], run_id: str, name: str, group: str,
                 config: Mapping[str, Any], wandb_id: str | None = None):
        import wandb

        self.mode = resolve_wandb_mode(logger_cfg.get("mode", "offline"))
        self.log_video_enabled = bool(logger_cfg.get("log_video", True))
        self.log_plots_enabled = bool(logger_cfg.get("log_plots", True))
        self._wandb = wandb
        directory = Path(logger_cfg.get("dir") or "wandb")
        if self.mode != "disabled":
            directory.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=logger_cfg.get("project", "jensenkv"),
            entity=logger_cfg.get("entity"),
            dir=str(directory),
            mode=self.mode,
            name=name,
            id=wandb_id,  # one W&B id per record: a log interrupted by a kill is redone under the same id
            resume="allow" if wandb_id and self.mode == "online" else None,
            group=group,
            tags=list(logger_cfg.get("tags") or []),
            config={**dict(config), "run_id": run_id},
            reinit="finish_previous",
            settings=wandb.Settings(silent=True, console="off", disable_git=True, save_code=False),
        )

    def log_metrics(self, metrics: Mapping[str, Any]) -> None:
        numeric = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and v is not None}
        self.run.log(numeric)
        for key, value in numeric.items():
            self.run.summary[key] = value

    def log_video(self, key: str, path: str | os.PathLike, caption: str | None = None) -> None:
        if self.log_video_enabled and self.mode != "disabled":
            self.run.log({key: self._wandb.Video(str(path), caption=caption, format="mp4")})

    def log_figure(self, key: str, figure: Any) -> None:
        if self.log_plots_enabled and self.mode != "disabled":
            self.run.log({key: self._wandb.Image(figure)})

    def finish(self, exit_code: int = 0) -> None:
        self.run.finish(exit_code=exit_code)
