"""Where the built-in model's weights live (read by its family and its loader; no model code imported)."""
from __future__ import annotations

from pathlib import Path

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
