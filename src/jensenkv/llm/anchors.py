"""transformers' own ``QuantizedCache`` (quanto / HQQ backends) on a window: the anchor rows of the LLM table.

The prefix runs in full precision and ``QuantizedCache`` quantizes it on its first update, as it does for a prompt;
the teacher-forced continuation then attends over [its dequantized prefix | its own full-precision K/V]: the same
protocol as ``prefill.measure_window``, with transformers' quantizers (its defaults but for the bits and group size:
axis 0 for keys and values, residual length 128). Its attention is plain softmax over the dequantized keys, so the
row is uncorrected, and its probes (P_S, dP_S) are not recorded: only the NLL.
"""
from __future__ import annotations

import time

import torch

from jensenkv.llm.prefill import token_nll

HF_AXIS = 0  # transformers.QuantizedCache's default axis_key / axis_value
BACKEND_MODULES = {"quanto": ("optimum.quanto", "optimum-quanto"), "hqq": ("hqq", "hqq")}


def check_backend(backend: str) -> None:
    """One line before any work when an anchor's backend package does not import."""
    import importlib

    module, package = BACKEND_MODULES[backend]
    try:
        importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any import failure means the anchor cannot run
        raise ValueError(f"hf_anchors: {backend!r} needs the package {package}, which does not import here "
                         f"({type(e).__name__}: {e}); `make setup` installs it, or leave {backend} out") from None
HF_RESIDUAL = 128  # its default residual_length


def anchor_settings(backend: str, bits: int, group_size: int) -> dict:
    """The QuantizedCache arguments an anchor run uses (part of its identity)."""
    return {"backend": backend, "nbits": bits, "q_group_size": group_size, "axis_key": HF_AXIS,
            "axis_value": HF_AXIS, "residual_length": HF_RESIDUAL}


@torch.no_grad()
def measure_anchor_window(lm, ids: torch.Tensor, prefix: int, settings: dict, nll_fp: float) -> dict:
    """NLL of the continuation of ids (1, L) over a QuantizedCache'd prefix, in ``measure_window``'s format."""
    from transformers import QuantizedCache

    start = time.perf_counter()
    cache = QuantizedCache(settings["backend"], lm.config, **{k: v for k, v in settings.items() if k != "backend"})
    lm(ids[:, :prefix], past_key_values=cache, use_cache=True)
    logits = lm(ids[:, prefix:], past_key_values=cache, use_cache=True).logits  # (1, L - P, V)
    nll = token_nll(logits[:, :-1], ids[:, prefix + 1:])
    seconds = time.perf_counter() - start
    return {"nll_fp": nll_fp, "bytes": {}, "seconds": {"none": seconds},
            "treatments": {"none": {"nll": float(nll.mean()), "layers": []}}}
