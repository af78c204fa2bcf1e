"""Sample frames of the built-in model with a BF16, an INT2 and an INT2 + Taylor cache, side by side.

    python scripts/sample_frames.py --out results/figures/samples_int2.png

Rows: (prompt, cache variant); columns: frames. Same prompt and seed in every row of a prompt, so the
rows differ only by the cache (INT2 = RTN, token groups of 32 channels, keys and values).
"""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from jensenkv.generate import generate_video  # noqa: E402
from jensenkv.models.adapters import build_adapter  # noqa: E402
from jensenkv.run import preset  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ("a red circle moving right on a dark background", "a blue square moving down on a dark background")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "results" / "figures" / "samples_int2.png")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompts", nargs="+", default=list(PROMPTS))
    args = p.parse_args()
    # The same presets as Table 1's rows (configs/quant/*.yaml, configs/correction/*.yaml).
    variants = (("BF16", preset("quant=bf16")), ("INT2", preset("quant=rtn", "quant.bits=2")),
                ("INT2 + Taylor", preset("quant=rtn", "quant.bits=2", "correction=taylor")))
    rows = []
    for prompt in args.prompts:
        for name, spec in variants:
            cache = spec.reference_cache_config() if spec.is_reference else spec.cache_config(keep_reference=False)
            attention = dataclasses.replace(spec.attention, probes=False)
            adapter = build_adapter(spec.model, cache=cache, attention=attention, generation=spec.generation)
            video = generate_video(adapter, prompt, args.seed).video  # (F, C, H, W) in [0, 1]
            rows.append((f"{prompt.split(' on ')[0][2:]}\n{name}", video))
    frames = rows[0][1].shape[0]
    fig, axes = plt.subplots(len(rows), frames, figsize=(frames * 1.0, len(rows) * 1.1))
    for r, (label, video) in enumerate(rows):
        for f in range(frames):
            ax = axes[r, f]
            ax.imshow(video[f].permute(1, 2, 0).clamp(0, 1).numpy(), interpolation="nearest")
            ax.set_xticks([]), ax.set_yticks([])
        axes[r, 0].set_ylabel(label, rotation=0, ha="right", va="center", fontsize=7)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
