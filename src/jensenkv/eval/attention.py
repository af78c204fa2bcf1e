"""Attention metrics from the generator's probes: P_S / P_R per layer and denoising step, the mass shift
delta_p_s = P_S(quantized cache) - P_S(the same call with the run's own cache in full precision) (mean
and median), Jensen-Shannon divergence and output error.

A probe is one dict per (layer, step, chunk, branch) as recorded by ``jensenkv.attention.attention_probes``
(keys p_s, p_r, p_s_ref, delta_p_s, jsd, out_mse, out_rel_err, ...). ``step`` is the denoising step, or
None for the commit pass (stored as -1 here so it survives CSV round trips).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pandas is imported where a probe table is built: importing the scorers loads none
    import pandas as pd

COMMIT_STEP = -1
SUMMARY_KEYS = ("p_s", "p_r", "p_s_ref", "delta_p_s", "jsd", "out_mse", "out_rel_err",
                # error-model diagnostics (attention.diagnostics=true; jensenkv.attention.diagnostics)
                "em_mean_err", "em_mean_err_small", "em_mean_err_large", "em_mean_err_abs", "em_small_fraction",
                "em_slope", "em_corr", "em_var_ratio", "em_log_zs_shift", "em_first_order", "em_jensen",
                "em_predicted_taylor", "em_predicted_jensen", "em_n_eff", "em_n_eff_fraction")
REQUIRED_KEYS = ("layer", "step", "chunk", "branch", "p_s", "p_s_ref", "delta_p_s")


def probe_frame(probes: Sequence[dict], prompt_index: int = 0, seed: int = 0) -> pd.DataFrame:
    """Probes -> DataFrame, one row per probe, with prompt_index and seed columns added."""
    if not probes:
        raise ValueError("probes=[] is not allowed: there is nothing to summarize")
    import pandas as pd

    frame = pd.DataFrame(list(probes))
    absent = [k for k in REQUIRED_KEYS if k not in frame.columns]
    if absent:
        raise ValueError(f"probes lack the keys {absent}; got {sorted(frame.columns)}")
    frame["step"] = frame["step"].fillna(COMMIT_STEP).astype(int)
    if "p_r" not in frame.columns:
        frame["p_r"] = 1.0 - frame["p_s"]
    frame.insert(0, "seed", int(seed))
    frame.insert(0, "prompt_index", int(prompt_index))
    return frame


def denoising_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Probes of denoising steps only (the commit pass at t = 0 attends the same cache but is not sampled)."""
    return frame[frame["step"] != COMMIT_STEP]


def summary_keys() -> set[str]:
    """The metric names ``summarize_probes`` can give."""
    return {f"{k}_mean" for k in SUMMARY_KEYS} | {"delta_p_s_median", "delta_p_s_abs_mean"}


def summarize_probes(frame: pd.DataFrame) -> dict[str, float]:
    """Scalar attention metrics over every denoising probe: ``<key>_mean`` and ``delta_p_s_median``."""
    rows = denoising_rows(frame)
    if rows.empty:
        rows = frame
    out = {f"{k}_mean": float(rows[k].mean()) for k in SUMMARY_KEYS if k in rows.columns}
    out["delta_p_s_median"] = float(rows["delta_p_s"].median())
    out["delta_p_s_abs_mean"] = float(rows["delta_p_s"].abs().mean())
    return out


def mass_by_layer_step(frame: pd.DataFrame) -> pd.DataFrame:
    """Mean P_S, P_R, P_S(BF16) and delta_p_s per (layer, step) over prompts, chunks and branches."""
    cols = [k for k in ("p_s", "p_r", "p_s_ref", "delta_p_s", "jsd") if k in frame.columns]
    return denoising_rows(frame).groupby(["layer", "step"], as_index=False)[cols].mean()
