"""The paper's LLM partial-prefill diagnostic on one window of text.

A window holds L tokens. Its first P tokens (the prefix) are run once in full precision; their K/V (post-RoPE)
are stored in a ``JensenKVCache`` with the quantizer under test, which quantizes them once. The last L - P tokens
(the continuation) are then teacher-forced over [quantized prefix | their own full-precision K/V, causally],
once per treatment (correction, second order), over the same stored prefix. Measured per window and treatment:

- nll: the continuation's mean negative log-likelihood in nats per token, over its tokens P+1 .. L-1 (the
  logits at P .. L-2; the prediction of token P comes from the prefix's own, unquantized pass), and nll_fp, the
  same tokens with the full-precision prefix (one forward over the whole window);
- per layer, from the attention probes (``attention_probes`` with causal=True, averaged over heads and the
  continuation's queries): P_S (mass on the prefix), P_S with the full-precision prefix in the same call, dP_S,
  JSD, the output's relative error, and the Taylor bias statistics (``llm.attention.head_statistics``); with
  ``diagnostics`` (recorded on the uncorrected treatment: they describe the stored prefix) the error-model split
  of the prefix's log-partition shift (``em_*``) and the Taylor bias statistics.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from jensenkv.attention.config import AttentionConfig
from jensenkv.llm.cache import JensenKVCache, PrefixPolicy
from jensenkv.quant import QuantConfig


@dataclass(frozen=True)
class Treatment:
    """One way of attending over the quantized prefix."""

    correction: str  # none | taylor | exact
    second_order: bool = False  # taylor2: b (1 - pi)

    @property
    def label(self) -> str:
        return f"{self.correction}2" if self.second_order else self.correction


TREATMENTS = {"none": Treatment("none"), "taylor": Treatment("taylor"), "exact": Treatment("exact"),
              "taylor2": Treatment("taylor", True), "exact2": Treatment("exact", True)}


def token_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """logits (1, T, V) predicting targets (1, T) -> (T,) nats, in float64."""
    return F.cross_entropy(logits[0].double(), targets[0], reduction="none")


@torch.no_grad()
def full_precision_pass(lm, ids: torch.Tensor, prefix: int) -> tuple[torch.Tensor, list]:
    """One forward over the window (1, L): (the continuation's token NLLs (L - P - 1,), the prefix's K/V per
    layer, (1, H_kv, P, D) each, post-RoPE)."""
    cache = DynamicCache(config=lm.config)
    logits = lm(ids, past_key_values=cache, use_cache=True).logits  # (1, L, V)
    nll = token_nll(logits[:, prefix:-1], ids[:, prefix + 1:])
    kv = [(layer.keys[:, :, :prefix].clone(), layer.values[:, :, :prefix].clone()) for layer in cache.layers]
    return nll, kv


@torch.no_grad()
def measure_window(lm, ids: torch.Tensor, prefix: int, quant: QuantConfig, treatments: list[Treatment],
                   sink_tokens: int = 0, backend: str = "cached", diagnostics: bool = False,
                   values: str = "same", fp: tuple[torch.Tensor, list] | None = None,
                   probe_layers: list[int] | None = None) -> dict:
    """The diagnostic on one window ids (1, L) for one quantizer and sink setting, every treatment.

    Returns {"nll_fp": float, "bytes": {...}, "seconds": {...}, "treatments": {label: {"nll": float,
    "layers": [per-layer probe dicts]}}}. ``fp``: a ``full_precision_pass`` of this window to reuse;
    ``probe_layers``: the layers probed (None: all).
    """
    nll_fp, kv = fp if fp is not None else full_precision_pass(lm, ids, prefix)
    settings = dict(backend=backend, probes=True, diagnostics=diagnostics, probe_layers=probe_layers)
    cache = JensenKVCache(lm.config, quant, AttentionConfig(**settings),
                          PrefixPolicy(sink_tokens=sink_tokens), values=values)
    start = time.perf_counter()
    cache.prefill(kv)
    seconds = {"quantize": time.perf_counter() - start}
    stats = cache.stats()
    out = {"nll_fp": float(nll_fp.mean()), "bytes": {"stored": stats.stored, "held": stats.held,
                                                     "bf16": stats.bf16}, "treatments": {}}
    targets = ids[:, prefix + 1:]
    for treatment in treatments:
        cache.drop_tail()
        # the error-model diagnostics describe the stored prefix, not the correction: on the baseline only
        cache.configure(AttentionConfig(correction=treatment.correction, second_order=treatment.second_order,
                                        **{**settings, "diagnostics": diagnostics and treatment.correction == "none"}))
        start = time.perf_counter()
        logits = lm(ids[:, prefix:], past_key_values=cache, use_cache=True).logits  # (1, L - P, V)
        seconds[treatment.label] = time.perf_counter() - start
        nll = token_nll(logits[:, :-1], targets)
        layers = sorted(cache.probe_records, key=lambda r: r["layer"])
        out["treatments"][treatment.label] = {"nll": float(nll.mean()), "layers": layers}
    out["seconds"] = seconds
    return out
