"""Side-by-side video strips: BF16 | quantized | corrected, one per prompt, for watching what a setting does.

``python -m jensenkv.report.videos [--results R] [--model M] [--correction taylor]`` writes, for one model
(``report.model_choice``) and every row of the claims' options (``report.options``: one context, the latest
run per row, replicate and variant) that has both an uncorrected and a corrected run,
``<results>/videos/<model>/<row>_<correction>/<prompt>.mp4`` and a labelled contact sheet of a few frames
(``.png``) beside it. The quantized and corrected videos are the two runs' videos of one replicate (the
first in Table 1's order), prompt and seed (the first seed); the BF16 video is the reference both were
scored against (``refs/<reference_id>.pt``). Each panel is enlarged by an integer factor, nearest neighbour
(``jensenkv.eval.video_files``).
"""
from __future__ import annotations

import argparse
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from jensenkv.checks import fail
from jensenkv.devices import available_cores
from jensenkv.exit_codes import EPILOG, PARTIAL, guarded, stop
from jensenkv.eval.video_files import UPSCALED_DIR, load_mp4, mp4_fps, save_mp4, upscale
from jensenkv.report.model_choice import choose_model
from jensenkv.report.options import load_options
from jensenkv.report.store_frame import load_results
from jensenkv.store.files import atomic_write
from jensenkv.store.results import ResultsStore

STRIP_DIR = "videos"  # under the results directory: <results>/videos/<model>/<setting>/<prompt>.mp4
GAP = 8  # pixels between two panels of a strip (even: the encoder's yuv420p needs even sides)
LABEL_HEIGHT = 32  # pixels of the label bar over a strip video
SHEET_FRAMES = 6  # frames on a contact sheet, evenly spaced


@dataclass
class Panel:
    """One video of a strip: its label, where it comes from, and the file or reference it is read from."""

    label: str
    source: str  # "run <id>" or "reference <id>"
    path: Path
    psnr: float | None = None


@dataclass
class Strip:
    """BF16 | quantized | corrected for one prompt and seed of one row."""

    model: str
    row: str
    correction: str
    prompt: str
    seed: int
    panels: tuple[Panel, Panel, Panel]

    @property
    def title(self) -> str:
        return f"{self.model}: {self.row}, none vs {self.correction}; prompt {self.prompt!r}, seed {self.seed}"


def slug(text: str, limit: int = 60) -> str:
    """A file name from free text: lower case, runs of other characters as one "-"."""
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-")[:limit].strip("-") or "x"


def _video_entries(store: ResultsStore, run_id: str) -> dict[tuple[str, int], dict]:
    """{(prompt, seed): per-prompt entry} of a run's videos that were saved."""
    record = store.read_record(run_id)
    return {(v["prompt"], int(v["seed"])): v for v in record.get("per_prompt", []) if v.get("video")}


def _panel(store: ResultsStore, label: str, run_id: str, entry: dict) -> Panel:
    psnr = (entry.get("metrics") or {}).get("psnr")
    return Panel(label, f"run {run_id}", store.run_dir(run_id) / "videos" / entry["video"],
                 float(psnr) if psnr is not None else None)


def first_seeds(quantized: dict[tuple[str, int], dict], corrected: dict[tuple[str, int], dict]) -> dict[str, int]:
    """{prompt: its smallest seed} of the videos both runs saved, prompts in the quantized run's order (its
    record's): never a set's order, which follows Python's per-process string hash (PYTHONHASHSEED) and made
    --figure show another prompt on every regeneration."""
    common = [key for key in quantized if key in corrected]
    first: dict[str, int] = {}
    for prompt, seed in sorted(common, key=lambda k: k[1]):  # stable: ties keep the record's prompt order
        first.setdefault(prompt, seed)
    return first


def plan_strips(results_dir: str | Path, model: str | None = None, correction: str = "taylor",
                rows: list[str] | None = None) -> tuple[str | None, list[Strip], list[str]]:
    """(the model shown, its strips, one line per row left without a strip and why); ``rows``: only these
    rows of the options (their names as in claims.md, e.g. "rtn INT2 g32"), else every row."""
    runs = load_results(results_dir)
    model = choose_model(runs, model, key="--model")
    if model is None:
        return None, [], [f"no finished runs under {results_dir}"]
    opts = load_options(results_dir, model)[model]
    store = ResultsStore(results_dir)
    if rows is not None and set(rows) - set(opts.rows):
        fail("--row", sorted(set(rows) - set(opts.rows)), f"use rows of {model}'s options: {opts.rows}")
    strips, skipped = [], []
    for row in opts.rows:
        if row == "bf16" or (rows is not None and row not in rows):
            continue
        if correction not in opts.variants(row) or "none" not in opts.variants(row):
            skipped.append(f"{row}: no pair of an uncorrected and a {correction} run")
            continue
        base, treated = opts.members(row, "none"), opts.members(row, correction)
        shared = [r for r in base["replicate"] if r in set(treated["replicate"])]  # Table 1's replicate order
        if not shared:
            skipped.append(f"{row}: its none and {correction} runs share no replicate (seed fields)")
            continue
        quantized_id = base.loc[base["replicate"] == shared[0], "run_id"].iloc[0]
        corrected_id = treated.loc[treated["replicate"] == shared[0], "run_id"].iloc[0]
        quantized, corrected = _video_entries(store, quantized_id), _video_entries(store, corrected_id)
        first_seed = first_seeds(quantized, corrected)
        if not first_seed:
            skipped.append(f"{row}: runs {quantized_id} and {corrected_id} saved no videos of a common prompt "
                           "(eval.save_videos=false?)")
            continue
        for prompt, seed in first_seed.items():
            q, c = quantized[(prompt, seed)], corrected[(prompt, seed)]
            if q.get("reference_id") != c.get("reference_id") or not q.get("reference_id"):
                skipped.append(f"{row}, {prompt!r} seed {seed}: runs {quantized_id} and {corrected_id} were scored "
                               "against different BF16 references")
                continue
            reference = Panel("BF16", f"reference {q['reference_id']}", store.ref_path(q["reference_id"]))
            strips.append(Strip(model, row, correction, prompt, seed,
                                (reference, _panel(store, f"{row} (no correction)", quantized_id, q),
                                 _panel(store, f"{row} + {correction}", corrected_id, c))))
    return model, strips, skipped


def read_panel(panel: Panel):
    """A panel's video, (F, C, H, W) uint8, enlarged (the run's upscaled copy when it has one)."""
    import torch

    if panel.source.startswith("reference"):
        return upscale(torch.load(panel.path, weights_only=True)["video"])
    large = panel.path.parent.parent / UPSCALED_DIR / panel.path.name
    return load_mp4(large) if large.exists() else upscale(load_mp4(panel.path))


def _label_bar(labels: list[str], panel_width: int):
    """(3, LABEL_HEIGHT, width) uint8: each label centred over its panel, white on black."""
    import matplotlib.pyplot as plt
    import numpy as np
    import torch

    width = len(labels) * panel_width + (len(labels) - 1) * GAP
    fig = plt.figure(figsize=(width / 100, LABEL_HEIGHT / 100), dpi=100, facecolor="black")
    for i, label in enumerate(labels):
        x = (i * (panel_width + GAP) + panel_width / 2) / width
        fig.text(x, 0.5, label, color="white", ha="center", va="center", fontsize=9)
    fig.canvas.draw()
    pixels = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()  # (LABEL_HEIGHT, width, 3)
    plt.close(fig)
    return torch.from_numpy(pixels).permute(2, 0, 1)


def strip_video(strip: Strip):
    """The strip as one video: (F, C, LABEL_HEIGHT + H, 3 W + 2 GAP) uint8, labels on top."""
    import torch

    videos = [read_panel(p) for p in strip.panels]  # each (F, C, H, W)
    shapes = {tuple(v.shape) for v in videos}
    if len(shapes) != 1:
        raise ValueError(f"the videos of {strip.title} differ in shape ({sorted(shapes)}): no strip")
    frames, channels, height, width = videos[0].shape
    gap = torch.zeros(frames, channels, height, GAP, dtype=torch.uint8)
    body = torch.cat([videos[0], gap, videos[1], gap, videos[2]], dim=-1)  # (F, C, H, 3 W + 2 GAP)
    bar = _label_bar([p.label for p in strip.panels], width)[:channels]  # (C, LABEL_HEIGHT, 3 W + 2 GAP)
    return torch.cat([bar.expand(frames, -1, -1, -1), body], dim=-2), videos


def contact_sheet(strip: Strip, videos, frames: int = SHEET_FRAMES):
    """A figure: one line per panel (label, PSNR against BF16), ``frames`` evenly spaced frames, numbered."""
    import matplotlib.pyplot as plt
    import numpy as np

    count = videos[0].shape[0]
    picks = sorted(set(np.linspace(0, count - 1, min(frames, count)).round().astype(int).tolist()))
    fig, axes = plt.subplots(len(videos), len(picks), figsize=(1.6 * len(picks) + 1.2, 1.7 * len(videos) + 0.6),
                             squeeze=False)
    for line, (panel, video) in enumerate(zip(strip.panels, videos)):
        for col, index in enumerate(picks):
            ax = axes[line][col]
            ax.imshow(video[index].permute(1, 2, 0).numpy(), interpolation="nearest")  # (H, W, C)
            ax.set_xticks([])
            ax.set_yticks([])
            if line == 0:
                ax.set_title(f"frame {index}", fontsize=8)
        label = panel.label + (f"\nPSNR {panel.psnr:.1f} dB" if panel.psnr is not None else "")
        axes[line][0].set_ylabel(label, fontsize=7, rotation=0, ha="right", va="center")
    fig.suptitle(strip.title, fontsize=9)
    fig.tight_layout()
    return fig


def write_strip(strip: Strip, folder: Path, name: str, fps: float | None) -> Path | str:
    """One strip's mp4 and contact sheet under ``folder``; the mp4's path, or why there is no strip."""
    import matplotlib.pyplot as plt

    try:
        video, panels = strip_video(strip)
    except (OSError, ValueError) as e:
        return f"{strip.title}: {e}"
    path = save_mp4(video, folder / f"{name}.mp4", fps or mp4_fps(strip.panels[1].path))
    fig = contact_sheet(strip, panels)
    atomic_write(folder / f"{name}.png", lambda f, fig=fig: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)
    return path


STRIPS_PER_WORKER = 8  # a spawned worker's imports (2.4 s) cost about 4 strips (0.65 s each): fewer do not pay


def write_strips(results_dir: str | Path, out_dir: str | Path | None = None, model: str | None = None,
                 correction: str = "taylor", fps: float | None = None, rows: list[str] | None = None,
                 workers: int | None = 1) -> tuple[str | None, list[Path], list[str]]:
    """Write every strip's mp4 and contact sheet, on ``workers`` processes (None: the usable cores, at least
    ``STRIPS_PER_WORKER`` strips each); (model, the mp4 paths in the plan's order, the rows skipped and why)."""
    results_dir = Path(results_dir)
    out = Path(out_dir) if out_dir is not None else results_dir / STRIP_DIR
    model, strips, skipped = plan_strips(results_dir, model, correction, rows)
    jobs, names = [], set()
    for strip in strips:
        folder = out / slug(strip.model) / f"{slug(strip.row)}_{slug(strip.correction)}"
        name = slug(strip.prompt)
        while (folder, name) in names:  # two prompts with one slug
            name += "-"
        names.add((folder, name))
        jobs.append((strip, folder, name, fps))
    if workers is None:
        workers = min(available_cores(), len(jobs) // STRIPS_PER_WORKER)
    if workers > 1 and len(jobs) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=multiprocessing.get_context("spawn")) as pool:
            done = list(pool.map(write_strip, *zip(*jobs)))
    else:
        done = [write_strip(*job) for job in jobs]
    skipped += [why for why in done if isinstance(why, str)]
    return model, [path for path in done if isinstance(path, Path)], skipped


def main(argv: list[str] | None = None) -> None:
    """``python -m jensenkv.report.videos`` (``make reproduce-table1`` runs it after the report)."""
    from jensenkv.report.publish import add_store_args

    parser = argparse.ArgumentParser(description="BF16 | quantized | corrected video strips, one per prompt",
                                     epilog=EPILOG)
    add_store_args(parser, "where --figure's figures/video_strip.png goes")
    parser.add_argument("--model", default=None, help="the model shown (default: the built-in model, else the first)")
    parser.add_argument("--correction", default="taylor", help="the corrected column (default: taylor)")
    parser.add_argument("--strips", default=None, help=f"where the strips go (default: <results>/{STRIP_DIR})")
    parser.add_argument("--row", action="append", default=None,
                        help='only this row (repeatable), named as in claims.md, e.g. "rtn INT2 g32" (default: all)')
    parser.add_argument("--fps", type=float, default=None, help="frames per second (default: the runs' videos')")
    parser.add_argument("--workers", type=int, default=None,
                        help=f"processes that write the strips (default: the usable CPU cores, at least "
                             f"{STRIPS_PER_WORKER} strips each)")
    parser.add_argument("--figure", action="store_true",
                        help="also publish the first strip's contact sheet as <out>/figures/video_strip.png "
                             "(from a store holding all of Table 1; else under <out>/partial/)")
    args = parser.parse_args(argv)
    if args.workers is not None and args.workers < 1:
        parser.error(f"--workers={args.workers} is not allowed: it must be >= 1")
    guarded(lambda: _main(args))


def _main(args: argparse.Namespace) -> None:
    from jensenkv.report.publish import Part, publish, recover_store, report_error
    from jensenkv.report.table1_build import missing_rows

    recover_store(args)
    try:
        model, written, skipped = write_strips(args.results, args.strips, args.model, args.correction, args.fps,
                                               args.row, args.workers)
    except (FileNotFoundError, ValueError) as e:
        report_error(e)
    for line in skipped:
        print(f"no strip: {line}")
    if not written:
        stop(f"incomplete: no strip written for model {model!r} under {args.results}", PARTIAL)
    where = written[0].parent.parent
    print(f"{len(written)} strip{'s' if len(written) != 1 else ''} of {model} (BF16 | quantized | {args.correction}) under {where}: "
          f"<setting>/<prompt>.mp4 and .png")
    if args.figure:  # a committed figure: the one rule of report.publish (Table 1's runs, else partial/)
        sheet = written[0].with_suffix(".png")
        part = Part("video_strip", {"figures/video_strip.png": lambda path: shutil.copyfile(sheet, path)},
                    missing_rows(args.results, correction=args.correction))
        published = publish(args.out or args.results, [part])
        print(f"figure: {published.paths['figures/video_strip.png']} ({sheet})")
        if not published.complete:
            stop(f"incomplete: {part.why}", PARTIAL)


if __name__ == "__main__":
    main()
