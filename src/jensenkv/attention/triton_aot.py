"""Compile the fused attention kernel for a GPU architecture on a machine without one, and read its machine code.

Triton's wheel carries ptxas and cuobjdump, so the kernel is compiled here for Hopper (sm_90, the H100/H200)
exactly as the GPU's first call would JIT it, and its SASS shows what the interpreter cannot: tensor-core
instructions (HGMMA on Hopper: a kernel with only HMMA or FFMA dots is on a slower path), registers per
thread, and spills (a stack frame, local-memory loads LDL). ``python -m jensenkv.attention.triton_aot``
prints one line per autotune config and variant; tests/attention/test_triton_aot.py holds the tuned configs to
HGMMA and no spills.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from jensenkv.attention.triton_kernel import (
    BIAS_EXACT,
    BIAS_NONE,
    BIAS_TAYLOR,
    OPERANDS,
    TUNE_CONFIGS,
    Layout,
    kernel_constants,
)

BIASES = {"none": BIAS_NONE, "taylor": BIAS_TAYLOR, "exact": BIAS_EXACT}
# pointer arguments' element types (the others are int32 sizes and strides, or float32 scales)
_POINTERS = {"QB": "fp32", "QMAX": "fp32", "KC": "u8", "VC": "u8", "KROW": "i32", "VROW": "i32", "COEF": "fp32",
             "STRENGTH": "fp32", "O": "fp32", "OF": "fp32", "LSE": "fp32"}
_FLOATS = ("scale_log2", "half_scale")
_TRITON_TYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float8_e4m3fn": "fp8e4nv"}


@dataclass(frozen=True)
class KernelBuild:
    """Resources of one compiled variant, read from its SASS."""

    registers: int  # per thread
    stack_bytes: int  # stack frame (spilled registers)
    local_loads: int  # LDL instructions (reads of spilled values)
    hgmma: int  # Hopper warpgroup tensor-core instructions
    hmma: int  # older warp-level tensor-core instructions
    exp2: int  # MUFU.EX2 (the softmax's exponentials)


def _device_kernel():
    """The @triton.jit kernel as the compiler sees it (TRITON_INTERPRET off while it is decorated)."""
    saved = os.environ.pop("TRITON_INTERPRET", None)
    try:
        spec = importlib.util.spec_from_file_location("jensenkv.attention._triton_device_aot",
                                                      Path(__file__).with_name("_triton_device.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if saved is not None:
            os.environ["TRITON_INTERPRET"] = saved
    return module.cached_attention_kernel


def _tool(name: str) -> str:
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: this triton wheel carries no {name} (CUDA backend tools)")
    return str(path)


def compile_kernel(correction: str = "taylor", bits: int = 2, group_size: int = 32, head_dim: int = 128,
                   operands: str = "bfloat16", step_dtype: str = "float16", block: tuple[int, int] = (128, 64),
                   num_warps: int = 8, num_stages: int = 3, gqa: int = 1, terms: int = 4,
                   capability: int = 90) -> KernelBuild:
    """Compile one variant for ``capability`` (90: Hopper) and read its resources from cuobjdump."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if correction not in BIASES:
        raise ValueError(f"correction={correction!r} is not allowed: use one of {tuple(BIASES)}")
    kernel = _device_kernel()
    operand = _TRITON_TYPES[operands]
    pointers = {**_POINTERS, "Q": operand, "QR": operand, "KX": operand, "VX": operand, "KF": operand,
                "VF": operand, "KS": _TRITON_TYPES[step_dtype], "VS": _TRITON_TYPES[step_dtype], "KZ": "u8", "VZ": "u8"}
    layout = Layout(bits=bits, groups=head_dim // group_size, zero_kind=1)
    constants = kernel_constants(head_dim, head_dim, gqa, layout, layout, BIASES[correction],
                                 terms if correction == "exact" else 1, OPERANDS[operands], False)
    constants.update(BLOCK_M=block[0], BLOCK_N=block[1])
    signature = {}
    for name in kernel.arg_names:
        if name in constants:
            signature[name] = "constexpr"
        elif name in pointers:
            signature[name] = "*" + pointers[name]
        else:
            signature[name] = "fp32" if name in _FLOATS else "i32"
    compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constants),
                              target=GPUTarget("cuda", capability, 32),
                              options={"num_warps": num_warps, "num_stages": num_stages})
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        usage = subprocess.run([_tool("cuobjdump"), "-res-usage", str(cubin)], capture_output=True, text=True,
                               check=True).stdout
        sass = subprocess.run([_tool("cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True,
                              check=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    if found is None:
        raise RuntimeError(f"cuobjdump -res-usage gave no register count: {usage[:200]!r}")
    return KernelBuild(int(found[1]), int(found[2]), len(re.findall(r"\bLDL\b", sass)), sass.count("HGMMA"),
                       len(re.findall(r"\bHMMA\b", sass)), sass.count("MUFU.EX2"))


def main() -> None:
    """One line per (head dim, correction, autotune config) at INT2 g32, BF16 operands."""
    for head_dim in (64, 128):
        for correction in ("none", "taylor", "exact"):
            for block_m, block_n, warps, stages in TUNE_CONFIGS:
                build = compile_kernel(correction, head_dim=head_dim, block=(block_m, block_n), num_warps=warps,
                                       num_stages=stages)
                print(f"sm_90 d{head_dim} {correction:6s} {block_m}x{block_n} w{warps} s{stages}: {build}", flush=True)


if __name__ == "__main__":
    main()
