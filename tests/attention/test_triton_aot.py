"""The fused kernel compiled for Hopper (sm_90) here, without a GPU (Triton's ptxas and cuobjdump): its dots run
on the warpgroup tensor cores (HGMMA) and the tuned configs do not spill, checks the interpreter cannot make."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jensenkv.attention.triton_kernel import TUNE_CONFIGS

pytest.importorskip("triton")
aot = pytest.importorskip("jensenkv.attention.triton_aot")


def build(**kwargs):
    try:
        return aot.compile_kernel(**kwargs)
    except FileNotFoundError as e:  # a triton wheel without the CUDA backend tools
        pytest.skip(str(e))


def test_the_kernel_runs_on_hopper_tensor_cores_without_spills() -> None:
    (block_m, block_n, warps, stages) = TUNE_CONFIGS[0]
    kernel = build(correction="taylor", block=(block_m, block_n), num_warps=warps, num_stages=stages)
    assert kernel.hgmma > 0 and kernel.hmma == 0  # wgmma, not the older warp-level mma
    assert kernel.stack_bytes == 0 and kernel.local_loads == 0, kernel
    assert kernel.exp2 > 0  # the base-2 softmax


def test_the_kernel_compiles_when_triton_is_imported_under_the_interpreter(tmp_path) -> None:
    """`TRITON_INTERPRET=1 make test`: triton's standard library is then interpreted for the whole process, so
    the kernel must not call it (its reductions' combine functions are its own). A fresh process and an empty
    Triton cache: a cached compile from an earlier run would hide the failure."""
    code = ("from jensenkv.attention.triton_aot import compile_kernel\n"
            "try:\n    print(compile_kernel(block=(64, 32), num_warps=4, num_stages=2).hgmma)\n"
            "except FileNotFoundError as e:\n    print('skip:', e)\n")
    env = {**os.environ, "TRITON_INTERPRET": "1", "TRITON_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    if done.stdout.startswith("skip:"):  # a triton wheel without the CUDA backend tools
        pytest.skip(done.stdout.strip())
    assert int(done.stdout) > 0


@pytest.mark.slow
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("config", TUNE_CONFIGS)
def test_every_tuned_config_is_spill_free(config, head_dim: int) -> None:
    block_m, block_n, warps, stages = config
    for correction, bits, step in (("taylor", 2, "float16"), ("none", 4, "float8_e4m3fn"), ("taylor", 8, "bfloat16")):
        kernel = build(correction=correction, bits=bits, step_dtype=step, head_dim=head_dim, block=(block_m, block_n),
                       num_warps=warps, num_stages=stages)
        assert kernel.hgmma > 0 and kernel.stack_bytes == 0 and kernel.local_loads == 0, (correction, bits, kernel)


def test_a_control_config_that_spills_is_seen() -> None:
    """Control: 64 x 128 tiles on 4 warps at d = 128 hold more than 255 registers a thread: the check sees it."""
    kernel = build(correction="taylor", block=(64, 128), num_warps=4, num_stages=2)
    assert kernel.stack_bytes > 0 and kernel.local_loads > 0
