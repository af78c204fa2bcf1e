"""`make gpu-check`: the GPU checks -> results/gpu_check.{csv,md} (jensenkv.bench.gpu_check; README "GPU check").

    python scripts/gpu_check.py                             # on a CUDA machine, within 450 s
    python scripts/gpu_check.py --dry-run --out-dir /tmp/g  # the plumbing on a CPU (TRITON_INTERPRET=1, toy sizes)
"""
from __future__ import annotations

from jensenkv.bench.gpu_check import main

if __name__ == "__main__":
    main()
