"""Ctrl-C before any job has started: one line and exit 130, whatever is loading.

While the libraries load, a KeyboardInterrupt can land inside a library's own ``try: import ... except``
and be swallowed, leaving a half-imported module (later: a recursion error in diffusers, and a job that
starts anyway). Nothing is written before a job starts, so the handler stops the process outright
(``os._exit``), which no library can catch. ``release`` hands Ctrl-C back to Python's KeyboardInterrupt
just before the jobs start, where the runs' own handling (one line, the summary, resume) takes over.
"""
from __future__ import annotations

import os
import signal
import sys

MESSAGE = "interrupted: before any job started (while loading the libraries and checking the values)"


def _stop(signum: int, frame: object) -> None:
    sys.stderr.write(MESSAGE + "\n")
    sys.stderr.flush()
    os._exit(130)


def guard() -> None:
    """Stop at Ctrl-C from now on, if Ctrl-C is Python's default here (not ignored, not a caller's own)."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _stop)


def release() -> None:
    """Ctrl-C raises KeyboardInterrupt again (only if ``guard`` installed the stop)."""
    if signal.getsignal(signal.SIGINT) is _stop:
        signal.signal(signal.SIGINT, signal.default_int_handler)
