"""Parallel sweep workers stop with their sweep: a joblib (loky) worker whose main process is killed would
otherwise run its job to the end, unseen.

The sweep's main process puts its PID in the environment (``mark_sweep_process``); its workers inherit it.
A worker (a process other than that one) watches that process in a daemon thread and ends itself at once
when it is gone, also when it died before the worker's job began (a PID reused by a younger process does not
count as alive). Polling, not Linux's ``PR_SET_PDEATHSIG``: that signal fires when the *thread* that started
the worker ends, not the process, and which thread starts loky's workers is loky's business. What a stopped
worker leaves (a lock, temporary files) is what a kill leaves: the next run takes the lock over and removes
the files.
"""
from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable

SWEEP_PID_ENV = "JENSENKV_SWEEP_PID"
POLL_S = 0.5  # how soon a worker notices that its sweep is gone
_watching: threading.Thread | None = None


def mark_sweep_process() -> None:
    """Called by the sweep's main process before it launches any job."""
    os.environ[SWEEP_PID_ENV] = str(os.getpid())


def is_sweep_worker() -> bool:
    """True in a process started by a sweep's main process (a joblib worker), not in the main process."""
    marked = os.environ.get(SWEEP_PID_ENV, "")
    return marked.isdigit() and int(marked) != os.getpid()


def _stop() -> None:
    print(f"stopping: the sweep's main process is gone (this worker, pid {os.getpid()}, ends with it)",
          file=sys.stderr, flush=True)
    os._exit(1)  # like the kill that ended the parent: no cleanup, the next run takes over what is left


def is_alive(pid: int) -> bool:
    """True while process ``pid`` runs and is older than this one (so not a later process given its PID)."""
    import psutil

    try:
        sweep = psutil.Process(pid)
        return sweep.status() != psutil.STATUS_ZOMBIE and sweep.create_time() <= psutil.Process().create_time()
    except psutil.NoSuchProcess:
        return False


def watch(alive: Callable[[], bool], on_gone: Callable[[], None] = _stop, poll_s: float = POLL_S) -> threading.Thread:
    """Call ``on_gone`` (default: end this process) as soon as ``alive()`` is False, checked every ``poll_s``."""
    stopped = threading.Event()

    def check() -> None:
        while True:
            if not alive():
                on_gone()
                return
            if stopped.wait(poll_s):
                return

    thread = threading.Thread(target=check, name="sweep watch", daemon=True)
    thread.start()
    return thread


def _joblib_job() -> bool:
    """True inside a job of Hydra's joblib launcher (SLURM jobs inherit the environment too, but their
    parent is the cluster's, not the sweep)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.initialized() and "joblib" in str(HydraConfig.get().launcher.get("_target_", "")).lower()
    except Exception:  # noqa: BLE001 - no Hydra context: not a sweep job
        return False


def stop_with_sweep() -> None:
    """In a joblib worker of a sweep, start watching the parent (once per process); elsewhere nothing (a run
    started alone may outlive its shell, e.g. under nohup)."""
    global _watching
    if _watching is None and is_sweep_worker() and _joblib_job():
        sweep = int(os.environ[SWEEP_PID_ENV])
        _watching = watch(lambda: is_alive(sweep))
