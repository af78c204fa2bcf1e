"""``python -m jensenkv.run``: the Hydra entry point."""
from __future__ import annotations

from jensenkv.run.cli import main

main()
