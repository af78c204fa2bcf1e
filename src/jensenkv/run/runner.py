"""Executes one RunSpec: BF16 references (shared, generated once), the quantized videos, metrics, the run
record (written last, atomically) and W&B. Resumable per prompt; a finished run is a no-op."""
from __future__ import annotations

import dataclasses
import json
import logging
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from jensenkv.run.spec import RunSpec

log = logging.getLogger("jensenkv.run")


def _to_uint8(video: Any) -> Any:
    """(F, C, H, W) float in [0, 1] -> uint8 (what a saved video holds; metrics compare these)."""
    import torch

    return (video.clamp(0, 1) * 255).round().to(torch.uint8)


def save_mp4(video_u8: Any, path: Path, fps: int) -> Path:
    """(F, C, H, W) uint8 -> H.264 mp4, encoded to a temp file and moved into place (os.replace)."""
    import os

    import imageio.v2 as imageio

    frames = video_u8.permute(0, 2, 3, 1).contiguous().numpy()  # (F, H, W, C)
    if frames.shape[-1] == 1:
        frames = frames.repeat(3, axis=-1)
    even = frames.shape[1] % 2 == 0 and frames.shape[2] % 2 == 0  # yuv420p needs even sides
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.mp4")
    try:
        imageio.mimwrite(tmp, list(frames), fps=fps, codec="libx264", quality=9, macro_block_size=1,
                         ffmpeg_log_level="error", pixelformat="yuv420p" if even else "yuv444p")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


class Runner:
    """Executes one RunSpec: references, generation, metrics, record, W&B."""

    def __init__(self, spec: RunSpec):
        from jensenkv.tracking import ResultsStore

        self.spec = spec
        self.store = ResultsStore(spec.results_dir)
        self.run_id = spec.run_id
        self.run_dir = self.store.run_dir(self.run_id)
        self._adapter = None
        self._lpips = None

    # lazily built so a finished run never loads the model
    @property
    def adapter(self):
        if self._adapter is None:
            from jensenkv.models import build_adapter

            self._adapter = build_adapter(self.spec.model, cache=self.spec.reference_cache_config(),
                                          generation=self.spec.generation)
        return self._adapter

    def reference(self, prompt: str, seed: int) -> tuple[str, Any]:
        """(ref id, (F, C, H, W) uint8 video): loaded from results/refs/ or generated once and stored."""
        import torch

        from jensenkv.generate import generate_video
        from jensenkv.config import AttentionConfig
        from jensenkv.tracking import atomic_write, config_hash

        ref_id = config_hash(self.spec.reference_identity(prompt, seed))
        path = self.store.ref_path(ref_id)
        if not path.exists():
            with self.store.ref_lock(ref_id):  # a parallel job making the same reference: wait, then reuse it
                if not path.exists():
                    self.adapter.configure(cache=self.spec.reference_cache_config(), attention=AttentionConfig(backend=self.spec.attention.backend))
                    result = generate_video(self.adapter, prompt, seed)
                    payload = {"video": _to_uint8(result.video), "timings": result.timings,
                               "identity": json.dumps(self.spec.reference_identity(prompt, seed), sort_keys=True,
                                                      default=str)}
                    atomic_write(path, lambda f: torch.save(payload, f))
                    log.info("stored BF16 reference %s for %r seed %d", ref_id, prompt, seed)
        return ref_id, torch.load(path, weights_only=True)["video"]

    def generate(self, prompt: str, seed: int) -> tuple[Any, list[dict] | None, dict, dict]:
        """(uint8 video, probes, timings, cache stats) of the quantized run."""
        from jensenkv.generate import generate_video
        attention = self.spec.attention  # probes on iff eval.metrics has "attention"
        self.adapter.configure(cache=self.spec.cache_config(keep_reference=attention.probes), attention=attention)
        result = generate_video(self.adapter, prompt, seed)
        caches = self.adapter.caches("cond")
        stats = {"cache_bytes": sum(c.nbytes for c in caches), "cache_bf16_bytes": sum(c.bf16_nbytes for c in caches)}
        return _to_uint8(result.video), result.probes, result.timings, stats

    def lpips(self):
        from jensenkv.eval.fidelity import LpipsScorer

        if self._lpips is None:
            self._lpips = LpipsScorer(self.spec.lpips_net, device=self.spec.model.device)
        return self._lpips

    def score_content(self, prompt: str, video: Any, metrics: dict, missing: dict) -> None:
        """Prompt-content recovery (colour and direction); BF16 runs get it too: it needs no reference."""
        from jensenkv.eval.content import content_match

        if self.spec.model.kind != "tiny":
            missing["content"] = "content recovery reads the built-in model's procedural videos only (model.kind=tiny)"
            return
        try:
            metrics.update(content_match(video.float() / 255, prompt))  # video: (F, C, H, W) uint8
        except ValueError as err:
            missing["content"] = f"content recovery needs a prompt in the built-in model's grammar: {err}"

    def prompt_result(self, index: int, prompt: str, seed: int) -> dict:
        """Generate and score one (prompt, seed); saved atomically so a rerun skips it."""
        from jensenkv.eval.attention import probe_frame, summarize_probes
        from jensenkv.eval.fidelity import lpips_availability, video_psnr, video_ssim
        from jensenkv.tracking import atomic_write_json, read_json

        path = self.store.prompt_result_path(self.run_id, index)
        if path.exists():
            return read_json(path)
        spec = self.spec
        ref_id, ref = self.reference(prompt, seed)
        metrics: dict[str, Any] = {}
        missing: dict[str, str] = {}
        if spec.is_reference:
            video, probes, timings, stats = ref, None, {}, {}
            for m in ("psnr", "ssim", "lpips", "attention"):
                if m in spec.metrics:
                    missing[m] = "BF16 run: it is its own reference"
        else:
            video, probes, timings, stats = self.generate(prompt, seed)
            x, y = video.float() / 255, ref.float() / 255  # (F, C, H, W) in [0, 1]
            if "psnr" in spec.metrics:
                psnr = video_psnr(x, y)
                if psnr == float("inf"):
                    missing["psnr"] = "video identical to its BF16 reference (PSNR is infinite)"
                else:
                    metrics["psnr"] = psnr
            if "ssim" in spec.metrics:
                metrics["ssim"] = video_ssim(x, y)
            if "lpips" in spec.metrics:
                status = lpips_availability(spec.lpips_net)
                if status.available:
                    metrics["lpips"] = self.lpips()(x, y)
                else:
                    missing["lpips"] = status.reason
            if "attention" in spec.metrics:
                if probes:
                    frame = probe_frame(probes, prompt_index=index, seed=seed)
                    metrics.update(summarize_probes(frame))
                    atomic_write_json(path.with_suffix(".attention.json"), frame.to_dict(orient="list"))
                else:
                    missing["attention"] = "the generator recorded no probes (a single chunk has no cache)"
        if "content" in spec.metrics:
            self.score_content(prompt, video, metrics, missing)
        video_file = None
        if spec.save_videos or "vbench" in spec.metrics:
            video_file = save_mp4(video, self.run_dir / "videos" / f"{index:04d}_s{seed}.mp4", spec.fps).name
        result = {"index": index, "prompt": prompt, "seed": seed, "reference_id": ref_id, "video": video_file,
                  "metrics": metrics, "missing": missing, "timings": timings, **stats}
        atomic_write_json(path, result)
        return result

    def run(self) -> dict | None:
        """Run (or skip, when finished) and return the record; None if another live process is running it."""
        import torch
        from tqdm.auto import tqdm

        if self.store.has_record(self.run_id):
            log.info("run %s already finished: nothing to do (%s)", self.run_id, self.store.record_path(self.run_id))
            return self.store.read_record(self.run_id)
        lock = self.store.run_lock(self.run_id)
        if not lock.try_acquire():  # e.g. bf16 x {none, taylor} in one parallel sweep: the same run twice
            log.info("run %s is in progress elsewhere (%s): skipping it here", self.run_id, lock.describe_holder())
            return None
        try:
            if self.store.has_record(self.run_id):  # finished while we waited for the lock
                return self.store.read_record(self.run_id)
            if self.spec.threads:
                torch.set_num_threads(self.spec.threads)
            start = time.perf_counter()
            jobs = [(p, s) for p in self.spec.prompts for s in self.spec.seeds]
            results = []
            for index, (prompt, seed) in enumerate(tqdm(jobs, desc=f"run {self.run_id} ({self.spec.key.label})",
                                                        unit="video", leave=False)):
                results.append(self.prompt_result(index, prompt, seed))
            self.store.write_record(self.assemble(results, time.perf_counter() - start))
        finally:
            lock.release()
        record = self.store.read_record(self.run_id)  # exactly what a later rerun returns
        log.info("run %s done: %s", self.run_id, {k: v for k, v in record["metrics"].items()
                                                   if k in ("psnr", "ssim", "lpips", "vbench", "delta_p_s_mean")})
        self.log_wandb(record)
        return record

    def assemble(self, results: list[dict], seconds: float) -> dict:
        """Aggregate per-prompt results (+ VBench over the run's videos) into the run record."""
        import pandas as pd

        from jensenkv.eval.attention import summarize_probes
        from jensenkv.eval.vbench import evaluate_vbench

        spec = self.spec
        metrics: dict[str, Any] = {}
        missing: dict[str, str] = {}
        per_metric: dict[str, list[float]] = {}
        for r in results:
            for k, v in r["metrics"].items():
                per_metric.setdefault(k, []).append(v)
            for k, reason in r["missing"].items():
                missing.setdefault(k, reason)
        for k, values in per_metric.items():
            if k in missing:  # some prompts lack it: an average over the rest would mislead
                continue
            metrics[k] = float(sum(values) / len(values))
        frames = [pd.DataFrame(json.loads(self.store.prompt_result_path(self.run_id, r["index"])
                                          .with_suffix(".attention.json").read_text()))
                  for r in results if "delta_p_s_mean" in r["metrics"]]
        if frames:  # medians must be taken over all probes, not averaged per prompt
            attention = pd.concat(frames, ignore_index=True)
            metrics.update(summarize_probes(attention))
            from jensenkv.tracking import atomic_write

            atomic_write(self.run_dir / "attention.csv", lambda f: attention.to_csv(f, index=False), mode="w")
        used: list[str] = []
        if "vbench" in spec.metrics:
            videos = {str(self.run_dir / "videos" / r["video"]): r["prompt"] for r in results}
            vb = evaluate_vbench(videos, spec.vbench_dimensions, spec.vbench_device or spec.model.device
                                 or "cpu")
            for dim, score in vb.scores.items():
                metrics[f"vbench_{dim}"] = score
                for r in results:
                    r["metrics"][f"vbench_{dim}"] = vb.per_video[dim].get(r["video"])
            for dim, reason in vb.missing.items():
                missing[f"vbench_{dim}"] = reason
            used = vb.used
            if vb.aggregate is None:
                missing["vbench"] = "no VBench dimension could run: " + "; ".join(f"{d}: {r}"
                                                                                 for d, r in vb.missing.items())
            else:
                metrics["vbench"] = vb.aggregate
        bytes_ = [r.get("cache_bytes") for r in results if r.get("cache_bytes")]
        bf16 = [r.get("cache_bf16_bytes") for r in results if r.get("cache_bf16_bytes")]
        if bytes_ and bf16:
            metrics["cache_bytes"] = float(sum(bytes_) / len(bytes_))
            metrics["effective_bits"] = 16.0 * sum(bytes_) / sum(bf16)
        elif spec.is_reference:
            metrics["effective_bits"] = 16.0 if spec.full_precision_dtype != "float32" else 32.0
        return {
            "run_id": self.run_id,
            "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "computed_from": self.provenance(used),
            "experiment_name": spec.experiment_name,
            "identity": spec.identity(),
            "labels": spec.labels(),
            "metrics": metrics,
            "missing": missing,
            "vbench_dimensions_used": used,
            "per_prompt": results,
            "seconds": seconds,
            "versions": _versions(),
        }

    def provenance(self, vbench_used: list[str]) -> dict:
        """What the metrics were computed from: the reference, the evaluator weights."""
        from jensenkv.eval.fidelity import lpips_backbone_path
        from jensenkv.eval.vbench import vbench_cache_dir

        spec = self.spec
        out: dict[str, Any] = {"reference": f"same model, prompt and seed with a full-precision "
                                            f"({spec.full_precision_dtype}) cache; per-prompt reference_id "
                                            "names the file under refs/",
                               "videos": "compared as 8-bit frames (F, C, H, W), as saved"}
        if "lpips" in spec.metrics:
            out["lpips"] = {"package": "lpips 0.1 linear heads", "net": spec.lpips_net,
                            "backbone": str(lpips_backbone_path(spec.lpips_net))}
        if "vbench" in spec.metrics:
            out["vbench"] = {"cache_dir": str(vbench_cache_dir()), "dimensions_used": vbench_used,
                             "aggregate": "mean x100 over dimensions_used"}
        return out

    def log_wandb(self, record: dict) -> None:
        """Config, metrics, one sample video and the attention plot; a W&B failure never loses the record."""
        from jensenkv.tracking import WandbRun

        labels = record["labels"]
        name = f"{labels['model']}/{labels['quantizer']}"
        if labels["method"] != "none":
            name += f"-int{labels['bits']}-g{labels['group_size']}-{labels['correction']}"
        try:
            wb = WandbRun(dataclasses.asdict(self.spec.logger), self.run_id, name, self.spec.experiment_name,
                          {**record["identity"], **labels, "run_id": self.run_id})
        except Exception as e:  # noqa: BLE001
            log.warning("W&B logging skipped (%s: %s); the local record is written", type(e).__name__, e)
            return
        try:
            wb.log_metrics(record["metrics"])
            first = record["per_prompt"][0] if record["per_prompt"] else None
            if first and first.get("video"):
                wb.log_video("sample_video", self.run_dir / "videos" / first["video"], caption=first["prompt"])
            csv = self.run_dir / "attention.csv"
            if csv.exists() and wb.log_plots_enabled and wb.mode != "disabled":
                import matplotlib

                matplotlib.use("Agg")
                import matplotlib.pyplot as plt
                import pandas as pd

                from jensenkv.report.figures import plot_attention_mass

                fig = plot_attention_mass({name: pd.read_csv(csv)})
                wb.log_figure("attention_mass", fig)
                plt.close(fig)
        finally:
            wb.finish()


def _versions() -> dict:
    import torch

    import jensenkv

    return {"jensenkv": jensenkv.__version__, "torch": torch.__version__}
