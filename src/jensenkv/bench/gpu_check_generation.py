"""The ``generation`` group of `make gpu-check`: a real-size random-weight SkyReels-V2-1.3B (544x960)
generating a few chunks with CFG, BF16 cache against INT2 g=32 + Taylor: peak GPU memory, cache held and
seconds per chunk.
"""
from __future__ import annotations

import statistics
import time

import torch

from jensenkv.bench.gpu_check_shapes import SKYREELS_CHUNK_FRAMES
from jensenkv.bench.gpu_check_context import GIB, CheckContext
from jensenkv.bench.gpu_check_inputs import INT2

def generation(ctx: CheckContext) -> None:
    """BF16 cache (backend "cached") against INT2 g=32 + Taylor (backend "triton") on one random-weight
    real-size SkyReels-V2-1.3B, one adapter reconfigured between the two."""
    from jensenkv.bench.presets import preset
    from jensenkv.bench.subjects import (
        PROMPT, SKYREELS_V2_1_3B, SKYREELS_V2_FRAME, TOY_SKYREELS, TOY_SKYREELS_FRAME, random_skyreels_adapter,
    )
    from jensenkv.generation.config import GenerationConfig
    from jensenkv.generation.loop import generate_video
    from jensenkv.attention.config import AttentionConfig

    config, frame = (TOY_SKYREELS, TOY_SKYREELS_FRAME) if ctx.dry_run else (SKYREELS_V2_1_3B, SKYREELS_V2_FRAME)
    # diffusers 0.42.1 cannot add the fps embedding (inject_sample_info) to per-frame timesteps of a batch of more
    # than one (CFG's two branches in one forward): its (B, F, 6, d) + (B*F, 6, d) sum fails. The embedding
    # costs nothing next to the blocks, so the memory and time are measured without it.
    config = {**config, "inject_sample_info": False}
    generation_cfg = GenerationConfig(num_chunks=2 if ctx.dry_run else 3, steps=1 if ctx.dry_run else 2,
                                      frames_per_chunk=2 if ctx.dry_run else SKYREELS_CHUNK_FRAMES, shift=8.0,
                                      guidance_scale=6.0)  # CFG: cond and uncond caches
    head_dim = config["attention_head_dim"]
    settings = {"bf16": (preset("bf16", head_dim), AttentionConfig(backend="cached")),
                "int2 g32 + taylor": (preset("rtn", head_dim, **INT2),
                                      AttentionConfig(backend="triton", correction="taylor"))}
    held: dict = {}

    def build() -> None:
        started = time.perf_counter()
        cache, attention = settings["bf16"]
        held["adapter"] = random_skyreels_adapter(config, frame, generation_cfg, cache, attention, ctx.device,
                                                  ctx.dtype)
        weights = sum(p.numel() * p.element_size() for p in held["adapter"].transformer.parameters())
        ctx.add("generation", "random-weight transformer", "measured", weights / GIB, "GiB weights",
                detail=f"{config['num_layers']} layers, {config['num_attention_heads']} x {head_dim} (no fps "
                       f"embedding: diffusers' sum fails for a CFG batch), latent frame "
                       f"{frame}, {generation_cfg.num_chunks} chunks x {generation_cfg.frames_per_chunk} frames, "
                       f"{generation_cfg.steps} steps, CFG", seconds=time.perf_counter() - started)

    if not ctx.run("generation", "build", build):
        return
    adapter = held["adapter"]
    measured: dict = {}
    for name, (cache, attention) in settings.items():
        def generate(name: str = name, cache=cache, attention=attention) -> None:
            adapter.configure(cache=cache, attention=attention)
            if ctx.device == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            started = time.perf_counter()
            with torch.inference_mode():
                result = generate_video(adapter, PROMPT, 0, generation_cfg)
            ctx.sync()
            elapsed = time.perf_counter() - started
            per_chunk = result.timings["per_chunk_s"]
            later = statistics.median(per_chunk[1:]) if len(per_chunk) > 1 else per_chunk[0]
            stored = sum(c.nbytes for branch in ("cond", "uncond") for c in adapter.caches(branch))
            measured[name] = {"s": later}
            ctx.add("generation", f"{name}: seconds per chunk", "measured", later, "s",
                    detail=f"median over chunks 2..{len(per_chunk)}; first chunk {per_chunk[0]:.2f} s "
                           "(compiles and autotunes)", seconds=elapsed)
            ctx.add("generation", f"{name}: cache held", "measured", stored / GIB, "GiB",
                    detail="stored bytes of both CFG branches' caches, all layers, after the last commit")
            if ctx.device == "cuda":
                measured[name]["peak"] = torch.cuda.max_memory_allocated() / GIB
                ctx.add("generation", f"{name}: peak GPU memory", "measured", measured[name]["peak"], "GiB",
                        detail="torch.cuda.max_memory_allocated over the generation, weights included")
            if not torch.isfinite(result.latents).all():
                ctx.add("generation", f"{name}: latents", "measured", detail="non-finite latents (random weights)")

        ctx.run("generation", name, generate)
    if len(measured) == 2:
        bf16, int2 = measured["bf16"], measured["int2 g32 + taylor"]
        ctx.add("generation", "int2 g32 + taylor / bf16: seconds per chunk", "measured", int2["s"] / bf16["s"],
                "time ratio")
        if "peak" in bf16:
            ctx.add("generation", "int2 g32 + taylor / bf16: peak GPU memory", "measured",
                    int2["peak"] / bf16["peak"], "memory ratio")
