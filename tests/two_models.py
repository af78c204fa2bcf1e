"""A results store with a second model: a copy of a real store plus every run again, as another model.

Each copy is the run's folder (videos, probes, per-prompt results) with the model's name changed in its
identity and labels, under the run id that identity gives; the BF16 references are shared. A plot or strip
that mixes models then draws a run id of the other model.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from jensenkv.hashing import config_hash
from jensenkv.store.results import ResultsStore

OTHER_MODEL = "a-second-model"  # sorts before the built-in model's name: the built-in one must still be chosen


def with_second_model(source: Path, target: Path, model: str = OTHER_MODEL) -> dict[str, str]:
    """Copy the store ``source`` to ``target`` and add each run again as ``model``; {copy's run id: original's}."""
    shutil.copytree(source, target)
    store, copies = ResultsStore(target), {}
    for record in list(store.iter_records()):
        identity = json.loads(json.dumps(record["identity"]))
        identity["model"]["name"] = model
        run_id = config_hash(identity)
        shutil.copytree(store.run_dir(record["run_id"]), store.run_dir(run_id), ignore=shutil.ignore_patterns(".lock*"))
        store.write_record({**record, "run_id": run_id, "identity": identity, "labels": {**record["labels"], "model": model}})
        copies[run_id] = record["run_id"]
    return copies
