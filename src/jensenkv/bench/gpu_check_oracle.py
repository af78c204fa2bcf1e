"""The ``oracle`` group of `make gpu-check`: the ``triton`` and ``flex`` backends against the float64 oracle
(``reference_attention``) at the real shapes, none / taylor / exact, on an INT2 g=32 cache; the relative error
of the output on evenly spaced query rows against a bf16 (or, dry run, float32) tolerance.
"""
from __future__ import annotations

import time

import torch

from jensenkv.bench.gpu import GpuShape
from jensenkv.bench.gpu_check_shapes import oracle_shapes
from jensenkv.bench.gpu_check_context import CheckContext
from jensenkv.bench.gpu_check_inputs import CORRECTIONS, attention_inputs, backend_call, oracle_output, relative_error

ORACLE_BACKENDS = ("triton", "flex")


BF16_TOLERANCE = 3e-2  # relative output error of a bf16 path against the float64 oracle (tests' flex bound)
FP32_TOLERANCE = 1e-4  # the dry run's float32 operands
ORACLE_ROWS = 256  # query rows per head the oracle recomputes


def oracle(ctx: CheckContext) -> None:
    from jensenkv.attention.backends import reads_kv_heads

    tolerance = BF16_TOLERANCE if ctx.dtype == torch.bfloat16 else FP32_TOLERANCE
    for shape in ctx.shapes(oracle_shapes()):
        held: dict = {}

        def build(shape: GpuShape = shape) -> None:
            held["inputs"] = attention_inputs(shape, ctx, quantized=True)
            n = min(ORACLE_ROWS, shape.queries)
            held["rows"] = torch.linspace(0, shape.queries - 1, n, device=ctx.device).round().long()

        if not ctx.run("oracle", f"{shape.describe()}: inputs", build):
            continue
        q, k_cur, v_cur, segments = held["inputs"]
        for correction in CORRECTIONS:
            expected: dict = {}
            if not ctx.run("oracle", f"{shape.describe()}, {correction}: float64 oracle",
                           lambda c=correction: expected.setdefault(
                               "out", oracle_output(q, k_cur, v_cur, segments, c, held["rows"]))):
                continue
            for backend in ORACLE_BACKENDS:
                case = f"{shape.describe()}, {correction}: {backend}"

                def check(backend: str = backend, correction: str = correction, case: str = case) -> None:
                    started = time.perf_counter()
                    out = backend_call(backend, q, k_cur, v_cur, segments, correction)
                    ctx.sync()
                    err = relative_error(out[:, :, held["rows"]], expected["out"])
                    dense = " (K/V repeated per query head: no GQA)" \
                        if not reads_kv_heads(backend) and shape.heads_q != shape.heads_kv else ""
                    ctx.add("oracle", case, "passed" if err <= tolerance else "failed", err, "relative error",
                            f"<= {tolerance:g}", f"{str(ctx.dtype).removeprefix('torch.')} operands, "
                            f"{len(held['rows'])} query rows per head{dense}", time.perf_counter() - started)

                ctx.run("oracle", case, check)
        del held, q, k_cur, v_cur, segments
        if ctx.device == "cuda":
            torch.cuda.empty_cache()
