"""Run ids are stable: the configs behind every committed result, and one per model preset, keep the ids (and
reference ids, and error messages) they had when the results were made. A change here re-runs every experiment
and orphans every store: when it is intended, regenerate tests/data/run_ids.json and say so."""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from jensenkv.config.resolve import compose_config, resolve
from jensenkv.hashing import config_hash

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "data" / "run_ids.json"
# The sweeps behind results/table1.* (Makefile: reproduce-table1), as (fixed overrides, sweep of experiment=table1).
TABLE1_SWEEPS = (
    ["experiment=table1"],
    ["experiment=table1", "quant=rtn", "correction=taylor2", "quant.rotation_seed=0"],
    ["experiment=table1", "quant=rtn_dither", "correction=taylor2", "quant.rotation_seed=0"],
    ["experiment=table1", "quant=rtn", "correction=taylor", "quant.rotation_seed=0",
     "attention.calibration=results/calibration/tiny-rtn-int2-g32-taylor.json"],
)


def sweep(overrides: list[str]) -> list[list[str]]:
    """Every job of a sweep: the experiment's declared sweep params, minus those the overrides fix."""
    params = dict(compose_config(overrides, hydra_config=True).hydra.sweeper.get("params") or {})
    fixed = {o.split("=", 1)[0] for o in overrides}
    axes = [[f"{k}={v}" for v in str(values).split(",")] for k, values in params.items() if k not in fixed]
    return [overrides + list(combo) for combo in itertools.product(*axes)]


def spec_of(overrides: list[str]):
    return resolve(OmegaConf.to_object(compose_config(overrides)))


def test_every_committed_table1_run_id_is_what_its_config_hashes(monkeypatch):
    monkeypatch.chdir(REPO)  # the calibrated row names its file relative to the project
    computed = {spec_of(job).run_id for overrides in TABLE1_SWEEPS for job in sweep(overrides)}
    committed = {rid for cell in pd.read_csv(REPO / "results" / "table1.csv")["run_id"].dropna()
                 for rid in str(cell).split(";")}
    assert committed and committed <= computed, sorted(committed - computed)


@pytest.mark.parametrize("key", sorted(json.loads(FIXTURE.read_text())))
def test_run_and_reference_ids_and_errors_are_unchanged(key, monkeypatch):
    monkeypatch.chdir(REPO)
    expected = json.loads(FIXTURE.read_text())[key]
    try:
        spec = spec_of(key.split())
    except ValueError as e:
        assert expected == {"error": f"ValueError: {e}"}
        return
    refs = [config_hash(spec.reference_identity(p, s)) for p in spec.prompts[:2] for s in spec.eval.seeds[:2]]
    assert {"run_id": spec.run_id, "refs": refs} == expected
