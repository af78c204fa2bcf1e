"""``python -m jensenkv.run``: the Hydra entry point.

Ctrl-C while the libraries load (seconds) is one line and exit 130, like Ctrl-C in the pre-check: nothing
has started. The handler is in place before the first heavy import (the package ``__init__`` is lazy).
"""
from __future__ import annotations

import sys

try:
    from jensenkv.run.cli import main
except KeyboardInterrupt:
    print("interrupted: before any job started (while loading the libraries)", file=sys.stderr)
    sys.exit(130)

main()
