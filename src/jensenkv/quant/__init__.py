"""jensenkv.quant: integer KV quantizers with real packed storage (RTN, KIVI layout, QuaRot rotation, QVG).

Entry points: `QuantConfig` (what to do), `make_quantizer(cfg, head_dim)` (a stateful Quantizer),
`Quantizer.quantize(x)` -> `QuantizedTensor` (dequantize(), nbytes, group_steps()).
"""
from __future__ import annotations

from jensenkv.quant.config import QuantConfig
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
from jensenkv.quant.steps import GroupSteps
from jensenkv.quant.tensors import FullPrecisionTensor, QuantizedTensor

__all__ = [
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
    "walsh_hadamard",
]
