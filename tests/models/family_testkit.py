"""One conformance kit for every model family: a case per family (its tiny preset and what it supports) and the
checks every family must pass, as diffusers' tester config x tester mixin (a case dataclass + shared check
functions + parametrized tests in tests/models/test_family_kit.py).

The checks, each a function that raises AssertionError naming what is wrong (so a planted defect can be shown to
fail them):

- ``check_generates``: one whole video, finite latents, frames in [0, 1];
- ``check_batch_equals_alone``: each video of a batch is the video alone (frames, latents, probes; the tolerance of
  tests/batch_testkit.py), for a family that batches;
- ``check_reserve_leaves_no_slack``: after a video every cache sized by ``reserve_caches`` holds exactly what it
  stores (``held_nbytes == nbytes``);
- ``check_probes_split_per_video``: each video's probe records are its own (no ``sample`` key, one complete and
  equal set of (layer, step, chunk, branch) per video);
- the CLI path, ``run_cli`` then ``check_cli_run`` (exit 0, "1 done", a record), ``check_store`` (the store's own
  check reads the run back without damage, and attention.csv holds text only in the family's label columns),
  ``check_reports`` (``report.table1`` and ``report.claims`` on the store: no traceback, done or partial) and
  ``check_rerun_is_noop`` ("1 skipped", nothing rewritten).

A new family is covered by adding its ``FamilyCase`` to ``CASES``. The kit reaches the suite through its public
surfaces: the CLI (``jensenkv.run.cli.main``, ``jensenkv.report.*.main``), ``jensenkv.run.preset``, the family
registry and the adapter's methods. The internal modules it needs (the generator, the cache, the store) are
imported in ``_internals`` only, so a module that moves is one line here.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from batch_testkit import batch_errors, within_tolerance

PROMPTS = ("a red square moving left", "a blue circle", "a red square moving left")
SEEDS = (3, 3, 11)  # videos 0 and 1 share a seed (prompts of different lengths), videos 0 and 2 a prompt
PROBES = dict(probes=True, diagnostics=True, head_moments=True)  # every probe value the batch check compares
PLAIN_PROBES = dict(probes=True)  # the other checks: the diagnostics cost more than the video (tiny: 5x)
INT2 = ("quant.bits=2", "correction=taylor")
CLI_METRICS = "eval.metrics=[psnr,ssim,attention]"  # scored without downloaded weights, probes written
SUMMARY = re.compile(r"summary: (\d+) run\(s\): (\d+) done, (\d+) skipped \(already finished\), (\d+) failed, "
                     r"(\d+) missing")


def _internals() -> Any:
    """The internal modules the kit needs, imported in this one place (their paths may move)."""
    import types

    from jensenkv.generation import loop as generate
    from jensenkv.cache import ChunkedKVCache
    from jensenkv.report.store_frame import load_results
    from jensenkv.store.results import ResultsStore

    return types.SimpleNamespace(generate_video=generate.generate_video, generate_videos=generate.generate_videos,
                                 ChunkedKVCache=ChunkedKVCache, ResultsStore=ResultsStore, load_results=load_results)


# --- the cases -----------------------------------------------------------------------------------------------
DIFFUSERS_HEAD_DIM = 16  # a power of two (Hadamard rotation), divisible by the group sizes below
DIFFUSERS_WORDS = ("<pad>", "</s>", "<unk>", "a", "red", "blue", "square", "circle", "moving", "left", "right")


def write_tiny_diffusers_folder(folder: Path, transformer_class: str) -> Path:
    """A complete diffusers-layout model folder at test sizes (transformer, Wan VAE, UMT5 and its word-level
    tokenizer), random weights from a fixed seed: what ``model.path`` of a diffusers preset reads."""
    import diffusers
    from diffusers import AutoencoderKLWan
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

    from wan_testkit import WAN_TEST_CONFIG

    torch.manual_seed(0)
    transformer = {**WAN_TEST_CONFIG, "attention_head_dim": DIFFUSERS_HEAD_DIM, "in_channels": 16,
                   "out_channels": 16, "text_dim": 32}
    getattr(diffusers, transformer_class)(**transformer).save_pretrained(folder / "transformer")
    AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                     temperal_downsample=[False, True, True]).save_pretrained(folder / "vae")
    UMT5EncoderModel(UMT5Config(vocab_size=32, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
                                relative_attention_num_buckets=8)).save_pretrained(folder / "text_encoder")
    core = Tokenizer(WordLevel({w: i for i, w in enumerate(DIFFUSERS_WORDS)}, unk_token="<unk>"))
    core.pre_tokenizer = Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(folder / "tokenizer")
    return folder


@dataclass(frozen=True)
class FamilyCase:
    """One family as the kit runs it: its tiny preset, the overrides that keep a video small, and what it
    supports. ``files`` (optional) writes what the preset reads into a folder and returns the overrides that
    point the preset at it (a diffusers preset reads its weights from ``model.path``)."""

    name: str                                   # the test id
    preset: tuple[str, ...]                     # the preset, e.g. ("model=magi1_tiny",)
    small: tuple[str, ...] = ()                 # a short video: chunks, steps, sizes
    batch_variants: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: {"int2-taylor": INT2})
    slow_batch_variants: frozenset[str] = frozenset()  # run with the slow tests only
    reserve_variants: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: {"int2": ("quant.bits=2",)})
    label_columns: frozenset[str] = frozenset({"branch"})  # attention.csv's text columns: labels, not numbers
    files: Callable[[Path], tuple[str, ...]] | None = None
    slow_cli: bool = False                       # the CLI path takes long: the slow tests run it
    slow_probe_split: bool = False               # the probe check takes long (three videos one at a time)
    batch_defect: str | None = None              # a known defect of its batches: the batch test is xfail, with it

    def overrides(self, folder: Path | None, *extra: str) -> list[str]:
        """The case's overrides (its files written under ``folder`` first, when it has any) plus ``extra``."""
        located = self.files(folder) if self.files is not None else ()
        return [*self.preset, "model.device=cpu", *located, *self.small, *extra]


def _diffusers_files(transformer_class: str) -> Callable[[Path], tuple[str, ...]]:
    def files(folder: Path) -> tuple[str, ...]:
        model = folder / f"tiny_{transformer_class}"
        if not (model / "tokenizer").is_dir():
            write_tiny_diffusers_folder(model, transformer_class)
        return (f"model.transformer_class={transformer_class}", f"model.path={model}", "model.height=32",
                "model.width=32", "model.dtype=float32", "model.max_sequence_length=8")
    return files


DIFFUSERS_SMALL = ("generation.num_chunks=3", "generation.frames_per_chunk=2", "generation.steps=3",
                   "generation.shift=3.0", "generation.guidance_scale=4.0", "attention.probe_layers=null",
                   "attention.probe_steps=null", "quant.group_size=4")
# the cache, correction and schedule settings a batch must keep per video (quantizer statistics, dither draws,
# k-means state, sinks and windows, the staircase, the x0 sampler's re-noising)
DIFFUSERS_BATCH = {
    "int2-g4-none": ("quant.bits=2", "correction=none"),
    "int2-g4-taylor": INT2,
    "int2-g4-exact": ("quant.bits=2", "correction=exact"),
    "int2-g4-taylor2": (*INT2, "attention.second_order=true"),
    "int2-tensor-taylor": (*INT2, "quant.granularity=tensor"),
    "int2-token-exact": ("quant.bits=2", "correction=exact", "quant.granularity=token"),
    "int2-kivi-taylor": ("quant=kivi", "quant.bits=2", "correction=taylor"),
    "int2-dither-taylor": ("quant=rtn_dither", "quant.bits=2", "correction=taylor"),
    "int2-hadamard-taylor": (*INT2, "quant.rotation=hadamard", "quant.rotation_seed=1"),
    "qvg-taylor": ("quant=qvg", "quant.bits=2", "quant.qvg_centroids=4", "quant.qvg_iters=4", "quant.qvg_tol=0.1",
                   "correction=taylor"),
    "sinks-window": (*INT2, "cache.sink_chunks=1", "cache.window_chunks=1"),
    "staircase-kv-range": (*INT2, "generation.steps=4", "generation.window_size=2", "generation.kv_range=[null,1]",
                           "generation.commit_kv_range=1"),
    "x0-renoise": ("quant.bits=2", "correction=exact", "generation.sampler=x0_renoise"),
}
# The Wan class differs from SkyReels-V2 in its patch embedding and timesteps, not in the cache or the correction:
# on Wan, the variants that reach those paths differently run fast, the others with the slow tests.
WAN_FAST = {"int2-g4-taylor", "int2-g4-exact", "staircase-kv-range", "x0-renoise"}

MAGI_SMALL = ("model.latent_height=4", "model.latent_width=4", "generation.steps=4", "quant.group_size=8")
# the three guidance passes (cond, prefix, uncond) on the staircase with the clean refresh, and the distilled
# single pass with its nearly-clean re-run; per-tensor and per-token-group statistics; each correction
MAGI_BATCH = {f"{mode}-{granularity}-{correction}": (
    "quant.bits=2", f"quant.granularity={granularity}", f"correction={correction}",
    *(("+model.model_overrides.distill=true", "generation.magi.cfg_number=1") if mode == "distilled" else ()))
    for mode in ("cfg3", "distilled") for granularity in ("tensor", "token_group")
    for correction in ("none", "taylor", "exact")}

WORLDPLAY_SMALL = ("generation.steps=2", "generation.num_chunks=3")

CASES = {case.name: case for case in (
    FamilyCase("tiny", ("model=tiny",), ("generation.num_chunks=3", "generation.steps=2"),
               reserve_variants={"int2": ("quant.bits=2",), "sink": ("quant.bits=2", "cache.sink_chunks=1")},
               # no leak (video 0 of a batch is bit-identical whatever the other videos are; a float64 forward
               # makes the batch bit-identical to the videos alone): SkyReels-V2's per-frame time embedding
               # (condition_embedder.time_embedder and time_proj) is a (branches x videos x frames)-row matmul that
               # rounds a batch's rows ~3e-7 unlike one video's; the BF16 cache turns that into flipped codes
               # (431 of 262144 in chunk 0) and the trained model's chain into frames 4e-4 apart (float32 cache:
               # 5e-6). Running those two modules one row at a time makes batch == alone bit for bit and leaves
               # every video alone unchanged, but changes the batched (batch 16) videos behind Table 1.
               batch_defect="the built-in model's batched videos differ from the videos alone, in BF16 too "
                            "(frames 4e-4 relative, 2026-12-07): the per-frame time embedding's batched matmul "
                            "rounds unlike one video's, amplified by the BF16 cache"),
    FamilyCase("skyreels_tiny", ("model=skyreels_v2_df_1_3b",), DIFFUSERS_SMALL, DIFFUSERS_BATCH,
               files=_diffusers_files("SkyReelsV2Transformer3DModel")),
    FamilyCase("wan_tiny", ("model=skyreels_v2_df_1_3b",), DIFFUSERS_SMALL, DIFFUSERS_BATCH,
               frozenset(DIFFUSERS_BATCH) - WAN_FAST, files=_diffusers_files("WanTransformer3DModel"),
               slow_cli=True),  # the same CLI path as skyreels_tiny
    # the uncorrected variants run with the slow tests: the fast ones reach the same passes and statistics
    FamilyCase("magi1_tiny", ("model=magi1_tiny",), MAGI_SMALL, MAGI_BATCH,
               frozenset(name for name in MAGI_BATCH if name.endswith("-none"))),
    FamilyCase("worldplay_tiny", ("model=worldplay_tiny",), WORLDPLAY_SMALL, {},
               reserve_variants={
                   # five chunks: the memory's buffers would outgrow what it stores (the control's slack)
                   "rebuild": ("quant.bits=2", "generation.num_chunks=5", "generation.worldplay.memory=rebuild"),
                   "append": ("quant.bits=2", "generation.num_chunks=5", "generation.worldplay.memory=append"),
                   "text-cached-sink": ("quant.bits=2", "generation.num_chunks=3", "cache.sink_chunks=1",
                                        "generation.worldplay.text_in_correction=true")},
               label_columns=frozenset({"branch", "stream"}), slow_cli=True, slow_probe_split=True),
)}


# --- building an adapter from a case -------------------------------------------------------------------------
def spec_of(case: FamilyCase, folder: Path | None, *extra: str) -> Any:
    """The resolved run spec of the case's preset with ``extra`` overrides (``jensenkv.run.preset``)."""
    from jensenkv.run import preset

    return preset(*case.overrides(folder, *extra))


def adapter_of(spec: Any, probes: Mapping[str, bool] | None = PLAIN_PROBES) -> Any:
    """The family's adapter (through the registry) for a spec's quantized cache, with the ``probes`` attention
    settings (None: the spec's own)."""
    from jensenkv.models.registry import family

    attention = dataclasses.replace(spec.attention, **probes) if probes else spec.attention
    return family(spec.model.kind).build_adapter(spec.model, spec.cache_config(False), attention, spec.generation)


def family_batches(spec: Any) -> bool:
    from jensenkv.models.registry import family

    return family(spec.model.kind).batches


# --- the shared checks ---------------------------------------------------------------------------------------
def check_generates(adapter: Any) -> None:
    """One whole video: latents (1, C, F, H, W) finite, frames (F, 3, H, W) in [0, 1], probes when asked for."""
    result = _internals().generate_video(adapter, PROMPTS[0], SEEDS[0])
    assert result.latents.dim() == 5 and result.latents.shape[0] == 1, tuple(result.latents.shape)
    assert torch.isfinite(result.latents).all(), "non-finite latents"
    video = result.video
    assert video.dim() == 4 and video.shape[1] == 3 and video.shape[0] >= 1, tuple(video.shape)
    assert torch.isfinite(video).all() and 0.0 <= float(video.min()) and float(video.max()) <= 1.0, \
        f"frames outside [0, 1]: {float(video.min())} .. {float(video.max())}"
    assert result.probes, "probes were asked for and none came back"


def check_batch_equals_alone(adapter: Any) -> None:
    """Each video of a batch of PROMPTS x SEEDS is the video alone: frames, latents and probes within
    batch_testkit's tolerance."""
    errors = batch_errors(adapter, list(PROMPTS), list(SEEDS))
    assert within_tolerance(errors), f"a batched video differs from the same video alone: {errors}"


def all_caches(adapter: Any, branches: tuple[str, ...]) -> list[Any]:
    """Every distinct cache the adapter holds for ``branches`` (``adapter.caches``), plus the text caches
    HY-WorldPlay keeps when text K/V is stored as a cache (no adapter method lists those)."""
    caches = [c for b in branches for c in adapter.caches(b)]
    worldplay = getattr(adapter, "_caches", None)
    if isinstance(worldplay, Mapping):
        caches += [c for b in branches if b in worldplay for c in getattr(worldplay[b], "text_caches", [])]
    return list({id(c): c for c in caches}.values())  # MAGI's passes share one cache


def generated_caches(adapter: Any, use_cfg: bool) -> list[Any]:
    """Every cache after one whole video."""
    _internals().generate_video(adapter, PROMPTS[0], SEEDS[0])
    return all_caches(adapter, ("cond", "uncond") if use_cfg else ("cond",))


def check_reserve_leaves_no_slack(caches: list[Any]) -> None:
    """Every cache holds exactly the bytes it stores (``reserve_caches`` sized it for the whole video)."""
    assert caches and all(c.nbytes > 0 for c in caches), "no cache stored anything"
    slack = [(c.held_nbytes, c.nbytes) for c in caches if c.held_nbytes != c.nbytes]
    assert not slack, f"caches holding other than what they store (held, stored): {slack}"


PROBE_PLACE = ("layer", "step", "chunk")  # with the family's label columns: where a probe was taken


def _probe_keys(records: list[dict], labels: frozenset[str]) -> list[tuple]:
    return [tuple(r.get(k) for k in (*PROBE_PLACE, *sorted(labels))) for r in records]


def check_probes_split_per_video(case: FamilyCase, adapter: Any, batches: bool) -> None:
    """Each video's probe records are its own: no ``sample`` key left, no place (layer, step, chunk and the
    family's labels: branch, ...) twice, and the same places for every video of a batch as for the video alone (one
    video at a time where the family does not batch)."""
    internals = _internals()
    alone = internals.generate_video(adapter, PROMPTS[0], SEEDS[0]).probes
    videos = [r.probes for r in internals.generate_videos(adapter, list(PROMPTS[:2]), list(SEEDS[:2]))] \
        if batches else [internals.generate_video(adapter, p, s).probes for p, s in zip(PROMPTS[:2], SEEDS[:2])]
    expected = sorted(_probe_keys(alone, case.label_columns), key=repr)
    assert expected and len(set(expected)) == len(expected), "the video alone has no probes or a probe twice"
    for i, probes in enumerate(videos):
        assert probes and not any("sample" in r for r in probes), f"video {i}: no probes, or a `sample` key left"
        assert sorted(_probe_keys(probes, case.label_columns), key=repr) == expected, \
            f"video {i} holds {len(probes)} probes, the video alone {len(expected)} (or other ones)"


# --- the CLI path --------------------------------------------------------------------------------------------
@dataclass
class CliRun:
    """What ``python -m jensenkv.run`` did: its exit code, its output, the summary counts and the store."""

    code: int | str | None
    output: str
    summary: dict[str, int]
    results: Path


def run_cli(module: str, args: list[str], cwd: Path) -> tuple[int | str | None, str]:
    """A command's ``main`` in this process (``python -m <module> <args>`` without the interpreter start), in
    ``cwd``: its exit code (0 when it returned) and its stdout + stderr."""
    import importlib
    import os

    main = importlib.import_module(module).main
    out = io.StringIO()
    here = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                main(args)
                code: int | str | None = 0
            except SystemExit as e:
                code = e.code
    finally:
        os.chdir(here)
    return code, out.getvalue()


def run_family_cli(case: FamilyCase, root: Path, *extra: str) -> CliRun:
    """``python -m jensenkv.run <preset> quant.bits=2 correction=taylor`` for one prompt into ``root/results``
    (Hydra's own files under ``root``)."""
    results = root / "results"
    args = [*case.overrides(root, *INT2, "eval.num_prompts=1", "eval.seeds=[0]", CLI_METRICS, "logger=disabled",
                            f"paths.results_dir={results}", *extra),
            f"hydra.run.dir={root / 'hydra'}", f"hydra.sweep.dir={root / 'multirun'}"]
    code, output = run_cli("jensenkv.run.cli", args, root)
    found = SUMMARY.findall(output)
    summary = dict(zip(("runs", "done", "skipped", "failed", "missing"), map(int, found[-1]))) if found else {}
    return CliRun(code, output, summary, results)


def check_cli_run(run: CliRun) -> str:
    """The run ended "1 done", exit 0, no traceback, and wrote its record: returns its run id."""
    assert "Traceback" not in run.output, run.output[-3000:]
    assert run.code in (0, None) and run.summary.get("done") == 1 and run.summary.get("runs") == 1, \
        f"exit {run.code}, summary {run.summary}: {run.output[-2000:]}"
    records = sorted(run.results.glob("runs/*/record.json"))
    assert len(records) == 1, f"records written: {records}"
    return records[0].parent.name


def check_store(case: FamilyCase, results: Path, run_id: str) -> None:
    """The store's own check reads the run back without damage (``ResultsStore.damage``, ``load_results``), and its
    attention.csv holds text only in the family's label columns: every probe value is a number."""
    import pandas as pd

    internals = _internals()
    store = internals.ResultsStore(results)
    damage = store.damage(run_id)
    assert damage is None, f"the store's check reports damage: {damage}"
    assert store.has_record(run_id), f"run {run_id} is not a finished run of the store"
    frame = internals.load_results(results)
    assert list(frame["run_id"]) == [run_id], list(frame.get("run_id", []))
    attention = pd.read_csv(store.run_dir(run_id) / "attention.csv")
    text = sorted(c for c in attention.columns if not pd.api.types.is_numeric_dtype(attention[c]))
    assert set(text) <= case.label_columns, \
        f"attention.csv of run {run_id} holds text in {text}; only {sorted(case.label_columns)} are labels"


def check_reports(results: Path, cwd: Path) -> dict[str, str]:
    """``report.table1`` and ``report.claims`` on the store: no traceback, exit done or partial (a one-run store is
    an incomplete Table 1), and their markdown written (under partial/ when incomplete). Returns their output."""
    outputs = {}
    for module, args, written in (
            ("jensenkv.report.table1", ["--results", str(results), "--no-figures"], "table1.md"),
            ("jensenkv.report.claims", ["--results", str(results)], "claims.md")):
        code, output = run_cli(module, args, cwd)
        assert "Traceback" not in output and code in (0, 1, None), f"{module}: exit {code}: {output[-3000:]}"
        assert (results / written).is_file() or (results / "partial" / written).is_file(), \
            f"{module} wrote no {written}: {output[-2000:]}"
        outputs[module] = output
    return outputs


def _tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*")) if p.is_file()}


def check_rerun_is_noop(case: FamilyCase, root: Path) -> None:
    """The same command again: "1 skipped", exit 0, and no file of the store's runs or references rewritten."""
    results = root / "results"
    before = {k: v for k, v in _tree(results).items() if k.startswith(("runs", "refs"))}
    again = run_family_cli(case, root)
    assert again.code in (0, None) and again.summary.get("skipped") == 1 and again.summary.get("done") == 0, \
        f"exit {again.code}, summary {again.summary}: {again.output[-2000:]}"
    after = {k: v for k, v in _tree(results).items() if k.startswith(("runs", "refs"))}
    assert after == before, f"the rerun wrote {sorted(set(after.items()) ^ set(before.items()))[:5]}"


