"""jensenkv.quant: integer KV quantizers with real packed storage (RTN, KIVI layout, QuaRot rotation, QVG).

Entry points: `QuantConfig` (what to do), `make_quantizer(cfg, head_dim)` (a stateful Quantizer),
`Quantizer.quantize(x)` -> `QuantizedTensor` (dequantize(), nbytes, group_steps()),
`bits_per_element(cfg, head_dim, tokens)` (the byte budget from the settings alone).
"""
from __future__ import annotations

from jensenkv.quant.budget import bits_per_element, qvg_paper_bits
from jensenkv.quant.config import QuantConfig
from jensenkv.quant.dither import DitherDraw
from jensenkv.quant.hadamard import RandomHadamard, walsh_hadamard
from jensenkv.quant.packing import pack_codes, packed_nbytes, unpack_codes
from jensenkv.quant.quantizers import (
    FullPrecisionQuantizer,
    QVGQuantizer,
    Quantizer,
    RTNQuantizer,
    make_quantizer,
)
from jensenkv.quant.qvg import QVGTensor
from jensenkv.quant.rtn import GroupLayout, RTNTensor, rtn_quantize
from jensenkv.quant.smoothing import ChannelMeanTensor
from jensenkv.quant.steps import GroupSteps
from jensenkv.quant.tensors import FullPrecisionTensor, QuantizedTensor

__all__ = [
    "ChannelMeanTensor",
    "DitherDraw",
    "FullPrecisionQuantizer",
    "FullPrecisionTensor",
    "GroupLayout",
    "GroupSteps",
    "QVGQuantizer",
    "QVGTensor",
    "QuantConfig",
    "QuantizedTensor",
    "Quantizer",
    "RTNQuantizer",
    "RTNTensor",
    "RandomHadamard",
    "make_quantizer",
    "pack_codes",
    "packed_nbytes",
    "rtn_quantize",
    "unpack_codes",
    "bits_per_element",
    "qvg_paper_bits",
    "walsh_hadamard",
]
