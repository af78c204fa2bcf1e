"""Commands that fill a report's missing cells: derived from a run the report has, checked by composing them.

A missing cell is a twin of a run in the store: the same context (model, prompts, seeds, probes: what
``store_frame.comparison_columns`` calls the context) and quantizer, with other bits and no correction, say. The
command names the run's experiment and the quant preset whose composed config gives that twin; a preset is
accepted only when the composed run has the store run's context and quantizer, with the requested changes.
"""
from __future__ import annotations

import copy
from functools import lru_cache
from pathlib import Path

from jensenkv.hashing import config_hash
from jensenkv.report.store_frame import comparison_columns
from jensenkv.store.results import ResultsStore

SEED_FIELDS = ("rotation_seed", "dither_seed")  # swept by the experiment itself: replicates, not part of the row
TRIES = 3


@lru_cache(maxsize=256)
def _identity(overrides: tuple[str, ...]) -> dict | None:
    """The run identity ``python -m jensenkv.run <overrides>`` would have (None when they do not compose)."""
    from jensenkv.config.resolve import build_spec, compose_config

    try:
        return build_spec(compose_config(list(overrides))).identity()
    except Exception:  # noqa: BLE001 - a preset that does not fit this model or experiment is no candidate
        return None


def _quant_presets() -> list[str]:
    from jensenkv.config.resolve import CONFIG_DIR

    return sorted(p.stem for p in (CONFIG_DIR / "quant").glob("*.yaml"))


@lru_cache(maxsize=64)
def _preset_settings(name: str) -> dict:
    """The fields a quant preset's YAML sets, its parents' (``defaults``) first."""
    from omegaconf import OmegaConf

    from jensenkv.config.resolve import CONFIG_DIR

    conf = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "quant" / f"{name}.yaml"))
    out: dict = {}
    for parent in conf.pop("defaults", None) or []:
        if isinstance(parent, str) and parent != "_self_":
            out.update(_preset_settings(parent))
    return {**out, **conf}  # callers only read it


def candidate_presets(key: dict) -> list[str]:
    """The quant presets most like the cache ``key`` (its identity's fields), best first, at most TRIES: a
    compose costs most of a second, so only these are composed and checked."""
    def score(name: str) -> int:
        return sum(1 if key.get(k) == v else -1 for k, v in _preset_settings(name).items()
                   if k not in ("bits", *SEED_FIELDS))

    return sorted(_quant_presets(), key=lambda name: -score(name))[:TRIES]


def _experiments() -> set[str]:
    from jensenkv.config.resolve import CONFIG_DIR

    return {p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml")}


def twin_identity(identity: dict, bits: int, correction: str) -> dict:
    """``identity`` with the cache at ``bits`` (keys, and values when quantized like keys) and ``correction``."""
    twin = copy.deepcopy(identity)
    for part in ("key", "value"):
        if isinstance(twin.get(part), dict) and twin[part].get("bits") == identity["key"].get("bits"):
            twin[part]["bits"] = bits
    twin["correction"] = correction
    return twin


def same_run(a: dict, b: dict) -> bool:
    """Same context and quantizer (seed fields aside: the experiment sweeps them) and the same correction."""
    def row(identity: dict) -> tuple:
        parts = [{k: v for k, v in (identity.get(p) or {}).items() if k not in SEED_FIELDS} for p in ("key", "value")]
        return (comparison_columns(identity)["context"], config_hash(parts), identity.get("correction"))

    return row(a) == row(b)


def fill_overrides(results_dir: str | Path, run_id: str, bits: int, correction: str = "none") -> list[str] | None:
    """Overrides of ``python -m jensenkv.run -m`` that run the twin of ``run_id`` at ``bits`` with ``correction``
    (every replicate its experiment sweeps), or None when no quant preset composes to it."""
    record = ResultsStore(results_dir).read_record(run_id)
    identity = record.get("identity")
    if not identity:
        return None
    wanted = twin_identity(identity, bits, correction)
    experiment = record.get("experiment_name")
    base = [f"experiment={experiment}"] if experiment in _experiments() else []
    plain = _identity(tuple(base))  # one compose rules out a store these configs cannot have made
    if plain is None or comparison_columns(plain)["context"] != comparison_columns(identity)["context"]:
        return None
    for preset in candidate_presets(identity.get("key") or {}):
        overrides = [*base, f"quant={preset}", f"quant.bits={bits}", f"correction={correction}"]
        composed = _identity(tuple(overrides))
        if composed is not None and same_run(composed, wanted):
            return overrides
    return None


def fill_command(results_dir: str | Path, run_id: str, bits: int, correction: str = "none") -> str | None:
    overrides = fill_overrides(results_dir, run_id, bits, correction)
    return None if overrides is None else "python -m jensenkv.run -m " + " ".join(overrides)
