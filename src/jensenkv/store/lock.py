"""Leased lock files: one process per run and per reference, across parallel sweep jobs on any host."""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from jensenkv.store.files import ResultsWriteError, atomic_write_json

log = logging.getLogger(__name__)


class LockError(ResultsWriteError):
    """A lock that can never be taken (its file cannot be read or created): one line instead of a wait."""


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
