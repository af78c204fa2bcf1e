"""Shared helpers for the pipeline tests: random-init tiny weights and a small, real results store.

Everything runs the real generator (jensenkv.generation.loop on the tiny SkyReels-V2 architecture) with random
weights at 2 chunks x 2 steps on CPU, so a run takes about a second.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

FAST = ("model.device=cpu", "generation.steps=2", "generation.num_chunks=2", "eval.num_prompts=1", "logger=disabled",
        "eval.metrics=[psnr,ssim,lpips,vbench,attention,content]", "eval.vbench.dimensions=[temporal_flickering]")


def write_random_tiny_weights(folder: Path, **sampler) -> Path:
    """Random-init weights in the tiny model's on-disk format (config.json + model.safetensors);
    ``sampler`` overrides the stored sampler defaults (e.g. steps=2, num_chunks=2)."""
    from jensenkv.generation.config import GenerationConfig
    from jensenkv.models.tiny import save_tiny
    from jensenkv.models.tiny.config import build_transformer, default_transformer_config
    from jensenkv.models.tiny.data import DataConfig
    from jensenkv.models.tiny.text import TextConfig, build_text

    torch.manual_seed(0)
    config = {"transformer": default_transformer_config(), "text": TextConfig().to_dict(),
              "data": DataConfig().to_dict(), "sampler": {k: v for k, v in dataclasses.asdict(GenerationConfig(**sampler)).items() if k in sampler}}
    _, text_encoder = build_text(TextConfig())
    save_tiny(folder, build_transformer(config["transformer"]), text_encoder, config)
    return folder


def fast_overrides(results_dir: Path, weights_dir: Path, *extra: str) -> list[str]:
    """Overrides for a tiny, quick run writing to ``results_dir``."""
    return [*FAST, f"model.weights_dir={weights_dir}", f"paths.results_dir={results_dir}", *extra]


# The settings the report and the notebooks need: the BF16 row, RTN at INT2 / INT4 (g=32), RTN INT2 with a
# min-aligned zero, dither or smoothing, QuaRot+RTN over two rotation seeds and QVG at INT2, each without and
# with the Taylor correction (every row of Table 1, attention mass), plus INT2 g=128 (a second trade-off point
# that Table 1 must leave out).
FIXTURE_RUNS = (
    ("quant=bf16",),
    *[(f"quant.bits={b}", "quant.group_size=32", f"correction={c}") for b in (2, 4) for c in ("none", "taylor")],
    *[(f"quant={q}", f"correction={c}") for q in ("rtn_min_aligned", "rtn_dither", "rtn_smooth")
      for c in ("none", "taylor")],
    *[("quant=quarot", "quant.bits=2", "quant.group_size=32", f"quant.rotation_seed={r}", f"correction={c}")
      for r in (0, 1) for c in ("none", "taylor")],
    *[("quant=qvg", "quant.qvg_centroids=16", "quant.bits=2", "quant.group_size=32", f"correction={c}")
      for c in ("none", "taylor")],
    ("quant.bits=2", "quant.group_size=128", "correction=taylor"),
)


def build_results_fixture(results_dir: Path, weights_dir: Path,
                          runs: tuple[tuple[str, ...], ...] = FIXTURE_RUNS) -> list[dict]:
    """Run each setting for real (FIXTURE_RUNS by default); returns their records."""
    from jensenkv.run import run_overrides

    return [run_overrides(fast_overrides(results_dir, weights_dir, *extra)) for extra in runs]


def ctrl_c_as_in_a_terminal() -> None:
    """preexec_fn for a child that the test interrupts with SIGINT: Ctrl-C at its default, as a terminal starts a
    command. A shell's background job (`make test &`, `nohup`) starts its children with SIGINT ignored, and the
    suite's commands rightly keep an ignored Ctrl-C ignored."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
