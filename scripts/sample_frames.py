"""Sample frames of the built-in model with a BF16, an INT2 and an INT2 + Taylor cache, side by side (`make samples`).

    python scripts/sample_frames.py [--out $JENSENKV_RESULTS or results] [--seed 0] [--prompts P ...]

Writes ``<out>/figures/samples_int2.png``. Rows: (prompt, cache variant); columns: frames, numbered. Same prompt
and seed in every row of a prompt, so the rows differ only by the cache (INT2 = RTN, token groups of 32
channels, keys and values). The committed figure is the default prompts and seed; other ones go to
``<out>/partial/figures/`` (``jensenkv.report.publish``).
"""
from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from jensenkv.report.publish import PARTIAL, Part, default_results, publish  # noqa: E402

PROMPTS = ("a red circle moving right on a dark background", "a blue square moving down on a dark background")
SEED = 0
NAME = "figures/samples_int2.png"
# The same presets as Table 1's rows (configs/quant/*.yaml, configs/correction/*.yaml): (row name, overrides)
VARIANTS = (("BF16", ("quant=bf16",)), ("INT2", ("quant=rtn", "quant.bits=2")),
            ("INT2 + Taylor", ("quant=rtn", "quant.bits=2", "correction=taylor")))


def plot_samples(rows: Sequence[tuple[str, torch.Tensor]], title: str) -> Figure:
    """One row of frames per (label, video (F, C, H, W) in [0, 1]); frame numbers over the columns."""
    frames = rows[0][1].shape[0]
    fig, axes = plt.subplots(len(rows), frames, figsize=(frames * 1.0 + 1.2, len(rows) * 1.1 + 0.7), squeeze=False)
    for r, (label, video) in enumerate(rows):
        for f in range(frames):
            ax = axes[r, f]
            ax.imshow(video[f].permute(1, 2, 0).clamp(0, 1).numpy(), interpolation="nearest")
            ax.set_xticks([]), ax.set_yticks([])
            if r == 0:
                ax.set_title(f"frame {f}", fontsize=7)
        axes[r, 0].set_ylabel(label, rotation=0, ha="right", va="center", fontsize=7)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    return fig


def samples_title(model: str, seed: int) -> str:
    """The figure's title: which model, quantizer and correction each row shows."""
    return (f"{model}: BF16 cache | INT2 RTN (g32, keys and values) | INT2 RTN + Taylor correction; seed {seed}, "
            "nearest-neighbour pixels")


def build_samples(prompts: Sequence[str], seed: int) -> Figure:
    from jensenkv.generation.loop import generate_video
    from jensenkv.models.adapters import build_adapter
    from jensenkv.run import preset

    rows, models = [], set()
    for prompt in prompts:
        for name, overrides in VARIANTS:
            spec = preset(*overrides)
            models.add(spec.labels()["model"])
            cache = spec.reference_cache_config() if spec.is_reference else spec.cache_config(keep_reference=False)
            attention = dataclasses.replace(spec.attention, probes=False)
            adapter = build_adapter(spec.model, cache=cache, attention=attention, generation=spec.generation)
            video = generate_video(adapter, prompt, seed).video  # (F, C, H, W) in [0, 1]
            rows.append((f"{prompt.split(' on ')[0][2:]}\n{name}", video))
    (model,) = models  # every row of one figure is one model
    return plot_samples(rows, samples_title(model, seed))


def samples_gaps(prompts: Sequence[str], seed: int) -> list[str]:
    """Why a figure is not the committed one: other prompts or seed than the defaults it describes."""
    gaps = [] if tuple(prompts) == PROMPTS else [f"the default prompts (given: {list(prompts)})"]
    return gaps + ([] if seed == SEED else [f"seed {SEED} (given: {seed})"])


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path(default_results()),
                   help="results dir: the figure goes to <out>/figures/ (default: $JENSENKV_RESULTS, else results)")
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--prompts", nargs="+", default=list(PROMPTS))
    args = p.parse_args(argv)
    fig = build_samples(args.prompts, args.seed)
    try:
        published = publish(args.out, [Part("samples", {NAME: lambda path: fig.savefig(path, dpi=110, format="png")},
                                            samples_gaps(args.prompts, args.seed))])
    finally:
        plt.close(fig)
    print(f"wrote {published.paths[NAME]}")
    for why in published.incomplete.values():
        print(f"{why}: written under {args.out / PARTIAL}, the committed figure is unchanged")


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
