"""The `slurm` set: faults against a real single-node cluster (`make test-slurm` starts it). Every test here is
marked `slurm` (so `make test` leaves them out) and skipped with one line where no cluster answers."""
from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.slurm)


@pytest.fixture(scope="session")
def cluster():
    from slurm_testkit import cluster_ready

    reason = cluster_ready()
    if reason is not None:
        pytest.skip(reason)
