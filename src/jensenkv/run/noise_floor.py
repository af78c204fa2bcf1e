"""``python -m jensenkv.run.noise_floor``: how far the videos move under changes that should not matter.

    python -m jensenkv.run.noise_floor experiment=table1 eval.num_prompts=4 eval.seeds=[0]   # -> results/noise_floor.csv

Effects on PSNR against the BF16 video are only meaningful beside what harmless changes do to it. For the
settings in ``BASES`` (the BF16 run itself, the paper's setting RTN INT2 g32, QuaRot and dither, uncorrected), each
video is
generated once as the run makes it and once per harmless perturbation (``PERTURBATIONS``, plus a base's own in
``BASE_PERTURBATIONS``):

- ``float32 cache``: the full-precision parts of the cache (the whole cache of the BF16 run) in float32 instead of
  bfloat16 (cache.full_precision_dtype);
- ``2 threads``: torch on 2 threads instead of the run's 1 (reductions may be split differently);
- ``in a batch``: generated inside a batch with the other videos instead of alone (generation.batch_size);
- ``another rotation seed`` (QuaRot) / ``another dither seed`` (dither): an equally valid draw of the quantizer's
  own randomness (seed 1 instead of 0), the same quantizer in distribution.

Per (base, perturbation, prompt, seed) it writes the PSNR of the perturbed video against the unperturbed one
(inf: identical) and, for the quantized bases, the change of PSNR against the BF16 video that the perturbation
alone causes (``d_psnr_vs_bf16``): the floor an effect on PSNR must clear. Videos are compared as 8-bit frames,
as the runs compare them. Runs nothing through the results store: no run id changes.
"""
from __future__ import annotations

import argparse
import logging
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jensenkv.exit_codes import EPILOG

log = logging.getLogger("jensenkv.noise_floor")
BASES = {"bf16": ["quant=bf16"], "rtn INT2 g32 none": ["quant=rtn", "correction=none"],
         "quarot+rtn INT2 g32 none": ["quant=quarot", "correction=none"],  # rotation seed 0, the default
         "rtn+dither INT2 g32 none": ["quant=rtn_dither", "correction=none"]}  # dither seed 0, the default
PERTURBATIONS = {"float32 cache": ["cache.full_precision_dtype=float32"], "2 threads": ["threads=2"],
                 "in a batch": ["generation.batch_size=4"]}
BASE_PERTURBATIONS = {"quarot+rtn INT2 g32 none": {"another rotation seed": ["quant.rotation_seed=1"]},
                      "rtn+dither INT2 g32 none": {"another dither seed": ["quant.dither_seed=1"]}}
COLUMNS = ("base", "perturbation", "prompt", "seed", "psnr_vs_unperturbed", "identical", "psnr_vs_bf16",
           "d_psnr_vs_bf16")


def videos(spec: Any, batch_size: int = 1) -> list[Any]:
    """The (F, C, H, W) uint8 videos of ``spec``'s (prompt, seed) jobs, generated ``batch_size`` at a time with
    spec.threads torch threads (1 when null)."""
    import torch

    from jensenkv.generation.loop import generate_videos
    from jensenkv.models import build_adapter
    from jensenkv.run.videos import check_finite, to_uint8 as _to_uint8

    torch.set_num_threads(spec.threads or 1)
    cache = spec.reference_cache_config() if spec.is_reference else spec.cache_config(keep_reference=False)
    adapter = build_adapter(spec.model, cache=cache, attention=spec.attention, generation=spec.generation)
    jobs = [(p, s) for p in spec.prompts for s in spec.eval.seeds]
    out = []
    for first in range(0, len(jobs), batch_size):
        batch = jobs[first:first + batch_size]
        for (prompt, seed), result in zip(batch, generate_videos(adapter, [p for p, _ in batch],
                                                                 [s for _, s in batch])):
            check_finite(result.video, f"{prompt!r} seed {seed}")
            out.append(_to_uint8(result.video))
    return out


def measure(overrides: Sequence[str] = ()) -> list[dict]:
    """The rows of ``COLUMNS`` for ``overrides`` (composed as ``python -m jensenkv.run`` composes them, with
    attention probes off: they do not change the videos)."""
    from jensenkv.eval.fidelity import video_psnr
    from jensenkv.run import compose_config
    from jensenkv.config.resolve import build_spec

    def spec_of(*extra: str) -> Any:
        return build_spec(compose_config([*overrides, "eval.metrics=[psnr]", *extra]))

    def batch_of(extra: Sequence[str]) -> int:
        sizes = [int(o.split("=", 1)[1]) for o in extra if o.startswith("generation.batch_size=")]
        return sizes[0] if sizes else 1

    def psnr(a: Any, b: Any) -> float:
        return video_psnr(a.float() / 255, b.float() / 255)

    bf16_spec = spec_of(*BASES["bf16"])
    bf16 = videos(bf16_spec)
    jobs = [(p, s) for p in bf16_spec.prompts for s in bf16_spec.eval.seeds]
    rows = []
    for base, base_overrides in BASES.items():
        plain = bf16 if base == "bf16" else videos(spec_of(*base_overrides))
        for name, extra in {**PERTURBATIONS, **BASE_PERTURBATIONS.get(base, {})}.items():
            log.info("noise floor: %s, %s", base, name)
            moved = videos(spec_of(*base_overrides, *extra), batch_of(extra))
            for (prompt, seed), x, y, ref in zip(jobs, moved, plain, bf16):
                level = psnr(x, y)
                row = {"base": base, "perturbation": name, "prompt": prompt, "seed": seed,
                       "psnr_vs_unperturbed": level, "identical": not math.isfinite(level),
                       "psnr_vs_bf16": math.nan, "d_psnr_vs_bf16": math.nan}
                if base != "bf16":
                    row["psnr_vs_bf16"] = psnr(x, ref)
                    row["d_psnr_vs_bf16"] = row["psnr_vs_bf16"] - psnr(y, ref)
                rows.append(row)
    return rows


def write_noise_floor(overrides: Sequence[str] = (), out: str | Path | None = None) -> Path:
    """``measure`` -> CSV (atomically) at ``out`` (default: <paths.results_dir>/noise_floor.csv)."""
    import pandas as pd

    from jensenkv.run import compose_config
    from jensenkv.store.files import atomic_write

    rows = measure(overrides)
    path = Path(out) if out is not None else Path(compose_config(list(overrides)).paths.results_dir) / "noise_floor.csv"
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    return atomic_write(path, lambda f: frame.to_csv(f, index=False, float_format="%.6g"), mode="w")


def main(argv: Sequence[str] | None = None) -> None:
    from jensenkv.run.cli import run_command

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(prog="python -m jensenkv.run.noise_floor", description=__doc__.split("\n\n")[0],
                                     epilog=EPILOG)
    parser.add_argument("--out", help="CSV path (default: <paths.results_dir>/noise_floor.csv)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for python -m jensenkv.run")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    run_command(args.overrides, lambda: write_noise_floor(args.overrides, args.out))


if __name__ == "__main__":
    main()
