"""Attention and probes of a batch of videos, each video computed as it would be alone (batched generation).

Both model families call these from their cached attention layers. Two things depend on the whole call
rather than on one row, so they run video by video: the exact correction (its series is normalized by the
largest |q| and step of the call, and its length chosen from them, so a video's rounding would depend on the
others, and 1e-7 can flip an INT2 code at the next commit), and the probes (their statistics are means over
the batch). Each video reads its own stored chunks through ``Segment.video``, so the fast paths run
on it exactly as alone.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from jensenkv.attention.config import AttentionConfig
from jensenkv.attention.diagnostics import head_shift_moments, segment_diagnostics
from jensenkv.attention.probes import attention_probes


def attend_videos(attend: Callable[..., torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  segments: Sequence[Any], settings: AttentionConfig, strength: Any, causal: bool = False,
                  scale: float | None = None) -> torch.Tensor:
    """``attend(q, k, v, segments, ...)`` with the settings' correction: q (B, H, T, D), k, v (B, H, K, D) ->
    (B, H, T, D); in one call, except the exact correction, which runs one sequence at a time. ``causal`` and
    ``scale`` (a causal LM's call) are passed only when set, so a registered kernel without them still serves
    the video models."""
    kwargs = dict(correction=settings.correction, strength=strength, second_order=settings.second_order)
    if causal:
        kwargs["causal"] = True
    if scale is not None:
        kwargs["scale"] = scale
    if settings.correction != "exact" or q.shape[0] == 1 or not segments:
        return attend(q, k, v, segments, **kwargs)
    return torch.cat([attend(q[b:b + 1], k[b:b + 1], v[b:b + 1], [seg.video(b) for seg in segments],
                             **kwargs) for b in range(q.shape[0])])


def probe_videos(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments: Sequence[Any],
                 settings: AttentionConfig, strength: Any, attended: torch.Tensor | None = None,
                 step: int | None = None, causal: bool = False, scale: float | None = None) -> list[dict]:
    """One dict of probe values per video (``sample``: its index in the batch), each computed on it alone:
    ``attention_probes`` plus the diagnostics and head moments the settings ask for. ``attended``: the
    (B, H, T, Dv) output ``attend_videos`` returned for these inputs, reused as the quantized output. ``step``:
    the denoising step, which decides whether the diagnostics are added (``settings.diagnoses_at``)."""
    diagnose = settings.diagnoses_at(step)
    records = []
    for sample in range(q.shape[0]):
        own = slice(sample, sample + 1)
        q_s, k_s, v_s = (q, k, v) if q.shape[0] == 1 else (q[own], k[own], v[own])  # (1, H, T, D)
        out_s = attended if attended is None or q.shape[0] == 1 else attended[own]  # (1, H, T, Dv)
        segs = list(segments) if q.shape[0] == 1 else [seg.video(sample) for seg in segments]
        values = attention_probes(q_s, k_s, v_s, segs, settings.correction, strength=strength,
                                  second_order=settings.second_order, attended=out_s, causal=causal,
                                  scale=scale)
        if settings.diagnostics and diagnose:
            values.update(segment_diagnostics(q_s, segs))
        if settings.head_moments and diagnose:
            values.update(head_shift_moments(q_s, segs, settings.correction))
        records.append({"sample": sample, **values})
    return records
