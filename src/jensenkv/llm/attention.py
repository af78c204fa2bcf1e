"""The suite's cached attention as a transformers attention function: ``attn_implementation="jensenkv"``.

``register()`` adds ``jensenkv_attention`` to transformers' ``AttentionInterface`` (and the matching mask
function). Then any causal LM whose attention calls the interface (Llama, Mistral, Qwen2, ...) runs

    model.set_attn_implementation("jensenkv")
    model(ids, past_key_values=JensenKVCache(model.config, quant, attention))   # or model.generate(...)

Each layer call attends over [the layer's quantized prefix | its full-precision tail, causally], with the
Jensen bias on the quantized prefix's keys only, through the backend ``attention.backend`` names (one that
takes ``causal=True``: cached, reference). GQA: the KV heads are expanded to the query heads for the call only;
the cache keeps the KV heads' stored form. Without a ``JensenKVCache`` (no cache, or another cache class) the
call is plain causal attention over the keys it is given, so the function is a drop-in for eager attention.
"""
from __future__ import annotations

import weakref

import torch

from jensenkv.attention.backends import get_backend
from jensenkv.attention.config import AttentionConfig
from jensenkv.attention.videos import attend_videos, probe_videos
from jensenkv.correction import group_bias
from jensenkv.llm.cache import owner_of

NAME = "jensenkv"
_PLAIN = AttentionConfig()  # a call without a JensenKVCache: the fast CPU path, no correction


_CHECKED: list = [None]  # (weakref to the last mask found causal, Q, K_total): every layer of a forward shares it


def _check_mask(mask: torch.Tensor | None, n_q: int, n_total: int) -> None:
    """The 4-D mask transformers built must be the causal pattern this function applies itself: a padded batch
    (or any other mask) is refused rather than silently dropped. Checked once per mask, not once per layer."""
    if mask is None:
        return
    last = _CHECKED[0]
    if last is not None and last[0]() is mask and last[1:] == (n_q, n_total):
        return
    visible = mask if mask.dtype == torch.bool else mask == 0  # (B, 1, Q, K_total)
    rows = torch.arange(n_q, device=mask.device).unsqueeze(1) + (n_total - n_q)
    causal = torch.arange(n_total, device=mask.device).unsqueeze(0) <= rows  # (Q, K_total)
    if visible.shape[-2:] != causal.shape or not bool((visible == causal).all()):
        raise ValueError("attention_mask: attn_implementation='jensenkv' applies the causal mask itself and "
                         "takes no padding or custom masks; pass unpadded sequences (batch rows of equal length)")
    _CHECKED[0] = (weakref.ref(mask), n_q, n_total)


def jensenkv_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                       **kwargs) -> tuple[torch.Tensor, None]:
    """query (B, H, Q, D); key, value (B, H_kv, R, D): what the layer's cache returned (its full-precision tail
    with this call's tokens last) -> (attn_output (B, Q, H, D), None)."""
    if dropout:
        raise ValueError(f"dropout={dropout} is not allowed: attn_implementation='jensenkv' is for inference "
                         "(call model.eval())")
    layer = owner_of(key)
    groups = query.shape[1] // key.shape[1]
    stored = layer.segments() if layer is not None else []
    segments = [seg.expanded(groups) for seg in stored]  # (B, H, K_i, D) views for this call only
    n_cached = layer.store.num_tokens if layer is not None else 0  # the visible chunks' tokens (no dequantizing)
    _check_mask(attention_mask, query.shape[2], n_cached + key.shape[2])
    k_cur = key.repeat_interleave(groups, dim=1) if groups > 1 else key  # (B, H, R, D)
    v_cur = value.repeat_interleave(groups, dim=1) if groups > 1 else value
    if layer is None:
        settings, strength = _PLAIN, 1.0
    else:
        cache = layer.cache
        settings, strength = cache.attention, cache.strengths[layer.layer_idx]
    attend = get_backend(settings.backend)
    out = attend_videos(attend, query, k_cur, v_cur, segments, settings, strength, causal=True,
                        scale=scaling)  # (B, H, Q, Dv)
    if layer is not None and segments and settings.probes and settings.probes_at(layer.layer_idx, None):
        for record in probe_videos(query, k_cur, v_cur, segments, settings, strength, attended=out, causal=True,
                                   scale=scaling):
            stats = head_statistics(query[record["sample"]:record["sample"] + 1],
                                    [seg.video(record["sample"]) for seg in segments], scaling) \
                if settings.diagnostics else {}
            layer.cache.probe_records.append({"layer": layer.layer_idx, **record, **stats})
    return out.transpose(1, 2).contiguous(), None  # (B, Q, H, Dv)


def head_statistics(q: torch.Tensor, segments, scale: float | None) -> dict[str, float]:
    """What sets the size of the Jensen bias in one call, q (1, H, Q, D) over the cached segments:
    taylor_b_mean / taylor_b_head_max: the Taylor bias b averaged over queries and quantized keys, over heads and
    its largest head; score_sd: the standard deviation of the cached scores along each row (reference keys),
    averaged over rows (how peaky attention over the cache can be)."""
    quantized = [seg for seg in segments if seg.steps is not None]
    out = {}
    if quantized:
        per_head = torch.cat([group_bias(q.float(), seg.steps, "taylor", scale) for seg in quantized], dim=-1)
        per_head = per_head.mean(dim=(0, 2, 3))  # (H,)
        out.update(taylor_b_mean=float(per_head.mean()), taylor_b_head_max=float(per_head.max()))
    keys = torch.cat([seg.k if seg.k_ref is None else seg.k_ref for seg in segments], dim=2)  # (1, H, K, D)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out["score_sd"] = float((scale * q.float() @ keys.float().transpose(-1, -2)).std(dim=-1).mean())
    return out


def register() -> None:
    """Make ``attn_implementation="jensenkv"`` known to transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, jensenkv_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
