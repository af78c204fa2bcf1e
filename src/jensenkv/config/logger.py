"""The logger node of the config tree (W&B) and the W&B mode it allows, beside the other config nodes: importing it
loads no logging library and no table library (the W&B run itself is ``jensenkv.run.wandb``)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

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


