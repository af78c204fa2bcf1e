"""Where a check group of `make gpu-check` runs and how it reports: the ``CheckContext`` (device, dtype, dry run,
deadline) emits one row per case and runs each case so that a failure becomes a row and no case starts past
the deadline.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from jensenkv.bench.gpu import GpuShape
from jensenkv.bench.gpu_check_shapes import toy_shape

GIB = float(1 << 30)


@dataclass
class CheckContext:
    """Where the group runs and how it reports: ``emit`` gets each row (a dict of gpu_check.COLUMNS)."""

    device: str
    dtype: torch.dtype
    dry_run: bool
    deadline: float  # time.time() after which no new case starts
    emit: Callable[[dict], None]

    def add(self, check: str, case: str, status: str, value: float = float("nan"), unit: str = "",
            target: str = "", detail: str = "", seconds: float = float("nan")) -> None:
        self.emit({"check": check, "case": case, "status": status, "value": float(value), "unit": unit,
                   "target": target, "detail": detail, "seconds": seconds})

    def run(self, check: str, case: str, body: Callable[[], None]) -> bool:
        """Run one case; its failure is a row with the error, and no case starts past the deadline."""
        if time.time() >= self.deadline:
            self.add(check, case, "skipped", detail="time budget spent before this case")
            return False
        started = time.perf_counter()
        try:
            body()
            return True
        except Exception as err:  # noqa: BLE001 - every failure is reported as a row, the next case still runs
            first = (str(err).strip().splitlines() or [""])[0][:300]
            self.add(check, case, "failed", detail=f"{type(err).__name__}: {first}",
                     seconds=time.perf_counter() - started)
            if self.device == "cuda":
                torch.cuda.empty_cache()
            return False

    def shapes(self, real: list[GpuShape]) -> list[GpuShape]:
        return [toy_shape(s) for s in real] if self.dry_run else real

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()
