"""The exit status of every command (``python -m jensenkv.run``, ``jensenkv.report.*``, ``jensenkv.calibration.fit``,
``jensenkv.doctor``, ...): one table, stated in each command's ``--help`` (``EPILOG``) and in the README, so a
script can tell done from partial from damaged.

    0    done: everything asked for is written (or was already there)
    1    partial: an undamaged but incomplete store or sweep (runs missing, a report written under partial/)
    2    bad input: a bad flag, value or path; nothing was done
    3    damaged or failed: a damaged run in the store, a run or a write that failed, an unexpected error
    4    differs: a rerun's result beyond its tolerance, or a changed verdict (``jensenkv.report.compare``)
    130  interrupted: Ctrl-C; what finished is kept, the same command resumes

No jensenkv import here: every layer may use it.
"""
from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

DONE = 0
PARTIAL = 1
BAD_INPUT = 2
FAILED = 3
DIFFERS = 4  # report.compare: did not reproduce (not damaged, not failed: a number moved too far)
INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C

MEANINGS = {DONE: "done", PARTIAL: "partial (incomplete store or sweep, not damaged)",
            BAD_INPUT: "bad input (nothing done)", FAILED: "damaged store or failed",
            DIFFERS: "differs beyond tolerance (report.compare)",
            INTERRUPTED: "interrupted (Ctrl-C)"}
EPILOG = "exit status: " + ", ".join(f"{code} {meaning}" for code, meaning in MEANINGS.items())


class CommandExit(SystemExit):
    """A command's end: ``code`` from the table, ``str()`` the one line it printed."""

    def __init__(self, message: str, code: int):
        super().__init__(code)
        self.message = message

    def __str__(self) -> str:
        return self.message


def stop(message: str, code: int) -> NoReturn:
    """Print ``message`` on stderr and exit with ``code``."""
    print(message, file=sys.stderr, flush=True)
    raise CommandExit(message, code)


def guarded(main: Callable[[], None]) -> None:
    """Run a command's body: Ctrl-C is one line and 130, an unexpected error its traceback and 3 (never 1,
    which means partial)."""
    try:
        main()
    except KeyboardInterrupt:
        stop("interrupted: Ctrl-C stopped the command; what it finished is kept", INTERRUPTED)
    except Exception:  # noqa: BLE001 - unexpected: the traceback says where, the status says failed
        traceback.print_exc()
        raise CommandExit("failed: unexpected error (traceback above)", FAILED) from None
