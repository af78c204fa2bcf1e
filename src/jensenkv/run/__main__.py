"""``python -m jensenkv.run``: the Hydra entry point.

Ctrl-C before any job starts (the libraries loading, the pre-check) is one line and exit 130: nothing has
started (``jensenkv.run.loading``). The guard is in place before the first heavy import (the package
``__init__`` is lazy); ``cli.main`` releases it just before Hydra launches the jobs.
"""
from __future__ import annotations

from jensenkv.run import loading

loading.guard()

from jensenkv.run.cli import main  # noqa: E402 - after the guard: this import loads torch, hydra, ...

main()
