"""The console line a finished run ends with: its headline metrics, and what is missing and why, in a few words.

A VBench score over one of five dimensions is not the same number as one over five, so the line says how many
dimensions it averages and why the others are missing; a metric the run could not compute (LPIPS without its
backbone weights) is named with its reason rather than left out.
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

SHOWN = {"psnr": "psnr {:.2f}", "ssim": "ssim {:.3f}", "lpips": "lpips {:.3f}", "vbench": "vbench {:.2f}",
         "delta_p_s_mean": "dP_S {:+.4f}"}  # the headline metrics, in this order
REASON_KEYS = {"delta_p_s_mean": "attention"}  # whose missing reason stands for the metric
VBENCH_DIMENSION = "vbench_"  # a record's per-dimension keys: vbench_<dimension>


def short_reason(reason: str) -> str:
    """A missing metric's reason in one short clause: its text before the first ": " or " (" (the rest names
    files and fixes; the record keeps the whole reason)."""
    head = re.split(r": | \(", str(reason), maxsplit=1)[0].strip()
    return head or str(reason)


def _vbench_part(metrics: Mapping[str, Any], missing: Mapping[str, str], used: list[str]) -> str | None:
    """"vbench 97.18 (1 of 5 dimensions; 4 weights missing)", "vbench missing (0 of 5 dimensions; ...)", or None
    when the run did not ask for VBench."""
    absent = {k.removeprefix(VBENCH_DIMENSION): v for k, v in missing.items() if k.startswith(VBENCH_DIMENSION)}
    if "vbench" not in metrics and "vbench" not in missing and not absent:
        return None
    total = len(used) + len(absent)
    why = ", ".join(f"{n} {reason}" for reason, n in Counter(short_reason(r) for r in absent.values()).items())
    if "vbench" in metrics:
        text = SHOWN["vbench"].format(float(metrics["vbench"]))
        return text + (f" ({len(used)} of {total} dimensions; {why})" if absent else "")
    return f"vbench missing ({f'0 of {total} dimensions; {why}' if why else short_reason(missing.get('vbench', 'not scored'))})"


def done_line(record: Mapping[str, Any]) -> str:
    """The headline metrics of a run record, then the missing ones grouped by reason, e.g. "psnr 31.20, ssim
    0.951, vbench 97.18 (1 of 5 dimensions; 4 weights missing), lpips missing (LPIPS backbone weights
    alexnet-owt-7be5be79.pth not found)"; a BF16 run: "vbench 97.40, psnr, ssim, lpips, dP_S missing (BF16 run)"."""
    metrics, missing = record.get("metrics") or {}, record.get("missing") or {}
    parts, gaps = [], {}  # gaps: {short reason: [metric names]}
    for key, fmt in SHOWN.items():
        name = fmt.split()[0]
        if key == "vbench":
            part = _vbench_part(metrics, missing, list(record.get("vbench_dimensions_used") or []))
            if part is not None and part.startswith("vbench missing"):
                gaps.setdefault(part.removeprefix("vbench missing (")[:-1], []).append(name)
            elif part is not None:
                parts.append(part)
        elif metrics.get(key) is not None:
            parts.append(fmt.format(float(metrics[key])))
        elif REASON_KEYS.get(key, key) in missing:
            gaps.setdefault(short_reason(missing[REASON_KEYS.get(key, key)]), []).append(name)
    parts += [f"{', '.join(names)} missing ({reason})" for reason, names in gaps.items()]
    return ", ".join(parts) or "no headline metric requested"
