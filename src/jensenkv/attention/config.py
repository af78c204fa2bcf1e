"""The attention node of the config tree: how the cached self-attention is computed, and each layer's
correction strength (the model families call ``layer_strengths`` once, at configure time)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from jensenkv.attention.backends import ATTENTION_BACKENDS, second_order_backends
from jensenkv.attention.second_order import check_second_order
from jensenkv.calibration import fail_calibration, load_calibration
from jensenkv.checks import check_bool, check_choice, fail, is_int
from jensenkv.correction import CORRECTIONS


@dataclass
class AttentionConfig:
    """How the cached self-attention is computed.

    backend: a kernel of jensenkv.attention.ATTENTION_BACKENDS: "cached" (fast CPU path), "reference" (the
        readable oracle), "flex" (GPU FlexAttention), or one registered there.
    correction: Jensen-bias correction of the cached scores; strength scales it (1.0: the paper's; any finite
        value, signed: a negative strength adds the bias).
    second_order: subtract b (1 - pi) instead of b (pi: the key's softmax weight in its row), which corrects
        log Z to second order where b over-corrects peaky attention (jensenkv.attention.second_order). Needs
        correction taylor or exact; the backends registered without it refuse it (flex and triton; cached and
        reference implement it).
    calibration: null, or the path of a calibration file of signed per-(layer, head) strengths
        (``python -m jensenkv.calibration``, jensenkv.calibration): the effective strength of layer l, head h is
        strength x file[l][h]. A run refuses a file fitted for another model, quantizer or correction, with
        other layer/head counts, or on prompts it evaluates; the file's digest is part of the run's id.
    probe_layers / probe_steps: the layers and denoising steps whose attention probes are recorded when
        eval.metrics has "attention" (null: all). Real models' presets set evenly spaced subsets
        (jensenkv.attention.probes.evenly_spaced): every layer x step x chunk x branch is ~7,200 calls per video.
    diagnostic_steps: the denoising steps whose probes also record the diagnostics and head moments below (null:
        every probed step). The error-model diagnostics cost more than the probes (float64, a second softmax):
        Table 1 probes every step and diagnoses a few.
    diagnostics: each probe also records the mean error in steps, slope and corr(k, e), Var(e)/(D^2/12), the
        first-order / Jensen split of the cached partition's shift with the Jensen term's prediction, and n_eff
        (keys em_*): why the correction helps or over-corrects, per layer and step.
    head_moments: each probe also records per-head sums of the realized cached log-partition shift and of the
        correction's softmax-weighted bias (keys hm_*, lists of H; jensenkv.attention.diagnostics.head_shift_moments):
        what ``python -m jensenkv.calibration`` fits per-(layer, head) strengths from.
    probes: whether probes are recorded; a run derives it from eval.metrics, Python callers set it.
    """

    backend: str = "cached"
    correction: str = "none"
    strength: float = 1.0  # scales the correction (1.0: the paper's; signed, any finite value)
    second_order: bool = False  # the b (1 - pi) correction (configs/correction/taylor2.yaml)
    calibration: Optional[str] = None  # path of a per-(layer, head) strength file (jensenkv.calibration)
    probe_layers: Optional[list[int]] = None
    probe_steps: Optional[list[int]] = None
    diagnostic_steps: Optional[list[int]] = None  # null: every probed step
    diagnostics: bool = False  # add the error-model diagnostics (jensenkv.attention.diagnostics) to each probe
    head_moments: bool = False  # add per-head shift / bias sums to each probe (what jensenkv.calibration fits)
    probes: bool = False

    def __post_init__(self) -> None:
        check_choice("attention.backend", self.backend, tuple(ATTENTION_BACKENDS))
        check_choice("attention.correction", self.correction, CORRECTIONS)
        if isinstance(self.strength, bool) or not isinstance(self.strength, (int, float)) \
                or not math.isfinite(self.strength):
            fail("attention.strength", self.strength, "must be a finite number (signed: a global multiplier)")
        if self.calibration is not None and (not isinstance(self.calibration, str) or not self.calibration.strip()):
            fail("attention.calibration", self.calibration, "must be null or the path of a calibration file")
        self._check_second_order()
        for key in ("probe_layers", "probe_steps", "diagnostic_steps"):
            value = getattr(self, key)
            if value is None:
                continue
            if isinstance(value, (str, bytes)) or not all(is_int(i) and i >= 0 for i in value):
                fail(f"attention.{key}", value, "use null (all) or a list of integer indices >= 0")
            setattr(self, key, sorted(set(value)))
        for key in ("probes", "diagnostics", "head_moments"):
            check_bool(f"attention.{key}", getattr(self, key))

    def validate(self) -> None:
        self.__post_init__()

    def _check_second_order(self) -> None:
        check_second_order(self.second_order, self.correction)
        if self.second_order and not ATTENTION_BACKENDS.capabilities(self.backend).second_order:
            fail("attention.second_order", self.second_order,
                 f"with backend={self.backend!r}: true needs a backend in {second_order_backends()}")

    def probes_at(self, layer: int, step: int | None) -> bool:
        """Whether a probe is recorded for this layer and denoising step."""
        return self.probes and (self.probe_layers is None or layer in self.probe_layers) and \
            (self.probe_steps is None or step in self.probe_steps)

    def diagnoses_at(self, step: int | None) -> bool:
        """Whether a probe at this denoising step also records the diagnostics and head moments asked for."""
        return self.diagnostic_steps is None or step in self.diagnostic_steps


def layer_strengths(attention: AttentionConfig, num_layers: int, heads: int | None = None,
                    device: torch.device | str = "cpu") -> list:
    """Each layer's correction strength, ready for the kernels, computed once when a model is configured: the
    float ``attention.strength`` for every layer without a calibration file, else (H,) float32 tensors
    strength * file[l] on ``device``. The file's layer count (and head count, when ``heads`` is given) must be
    the model's."""
    if attention.calibration is None:
        return [attention.strength] * num_layers
    cal = load_calibration(attention.calibration)
    if cal.layers != num_layers or (heads is not None and cal.heads != heads):
        fail_calibration(attention.calibration, f"it holds strengths for {cal.layers} layers x {cal.heads} heads, "
                                                f"the model has {num_layers} layers x "
                                                f"{heads if heads is not None else '?'} heads")
    table = torch.tensor(cal.strengths, dtype=torch.float64) * float(attention.strength)  # (L, H)
    return list(table.float().to(device).unbind(0))
