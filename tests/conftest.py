"""Shared fixtures: tiny random-init Wan-family models, tiny built-in-model weights, a small real results store.

No weights are downloaded: the Wan-family models are built at diffusers' own test sizes (patch (1, 2, 2),
2 heads x head dim 12, 2 layers) from a fixed seed, and the built-in model's weights are random-init ones
written in its on-disk format. What takes seconds to build (weights on disk, the results store) is
session-scoped; adapters are cheap and built per test, since tests change their caches.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from jensenkv.devices import available_cores

# pytest-xdist workers share the cores: each (and every process its tests start) gets its share of torch threads.
# Two workers on two cores with two OpenMP threads each spin-wait for each other's cores: the suite ran 8 min 22 s
# that way and 6 min 2 s with one thread per worker (2026-12-07, 2 cores). Set before torch loads OpenMP.
_WORKER_THREADS = (max(1, available_cores() // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1))
                   if os.environ.get("PYTEST_XDIST_WORKER") else None)  # None: not an xdist worker
if _WORKER_THREADS is not None:
    os.environ["OMP_NUM_THREADS"] = str(_WORKER_THREADS)

import pytest
import torch

if _WORKER_THREADS is not None:
    torch.set_num_threads(_WORKER_THREADS)  # in case a plugin imported torch first

from wan_testkit import WAN_FRAME, WAN_TEST_CONFIG, encode_prompt  # noqa: F401 - the tests' shared sizes


@pytest.fixture(scope="session", autouse=True)
def _offline_hub():
    """Hugging Face libraries stay offline in every test (and in the subprocesses tests start)."""
    import huggingface_hub.constants

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read at import, so set it too
        yield


@pytest.fixture
def wan_prompt_encoder() -> Callable[[list[str]], torch.Tensor]:
    return encode_prompt


@pytest.fixture
def tiny_wan_model() -> Callable[..., torch.nn.Module]:
    """Factory: ``make(cls=SkyReelsV2Transformer3DModel, seed=0, **overrides)``, a random-init transformer
    at the test sizes; the same seed gives the same weights."""
    from diffusers import SkyReelsV2Transformer3DModel

    def make(cls=SkyReelsV2Transformer3DModel, seed: int = 0, **overrides) -> torch.nn.Module:
        torch.manual_seed(seed)
        return cls(**{**WAN_TEST_CONFIG, **overrides})

    return make


@pytest.fixture
def tiny_wan_adapter(tiny_wan_model):
    """Factory: ``make(cls=..., cache=None, attention=None, generation=None, seed=0, fps=24, **model_overrides)``,
    a WanChunkwiseAdapter over a fresh tiny transformer (float32 cache unless ``cache`` is given; ``fps`` is read
    only with the model override ``inject_sample_info=True``)."""
    from diffusers import SkyReelsV2Transformer3DModel

    from jensenkv.generation.config import GenerationConfig
    from jensenkv.models.adapters import full_precision_cache
    from jensenkv.models.wan import WanChunkwiseAdapter

    def make(cls=SkyReelsV2Transformer3DModel, cache=None, attention=None, generation=None, seed: int = 0,
             fps: int = 24, **model_overrides):
        generation = generation if generation is not None else GenerationConfig(frames_per_chunk=2, steps=2)
        return WanChunkwiseAdapter(tiny_wan_model(cls, seed, **model_overrides), encode_prompt, WAN_FRAME, generation,
                                cache if cache is not None else full_precision_cache("float32"), attention,  # exact oracle checks
                                fps=fps)

    return make


@pytest.fixture
def int2_cache():
    """Factory: an INT2 (group 4) key and value cache config; keywords go to CacheConfig."""
    from jensenkv.cache import CacheConfig
    from jensenkv.quant import QuantConfig

    def make(**kwargs):
        return CacheConfig(key=QuantConfig(bits=2, group_size=4), value=QuantConfig(bits=2, group_size=4), **kwargs)

    return make


@pytest.fixture
def attention_spy(monkeypatch):
    """Register a recording kernel as attention backend "spy" (it wraps "cached" unless told otherwise).

    ``spy.calls`` lists (q, k_cur, v_cur, segments) per call; ``spy.hook(fn)`` adds a callback run on
    each call's arguments (e.g. to read the adapter's state at that moment).
    """
    from jensenkv.attention import ATTENTION_BACKENDS

    class Spy:
        def __init__(self, inner):
            self.inner, self.calls, self.hooks = inner, [], []

        def hook(self, fn):
            self.hooks.append(fn)

        def __call__(self, q, k_cur, v_cur, segments, **kwargs):
            self.calls.append((q, k_cur, v_cur, list(segments)))
            for fn in self.hooks:
                fn(q, k_cur, v_cur, segments)
            return self.inner(q, k_cur, v_cur, segments, **kwargs)

    spy = Spy(ATTENTION_BACKENDS["cached"])
    monkeypatch.setitem(ATTENTION_BACKENDS, "spy", spy)
    return spy


@pytest.fixture(scope="session")
def tiny_weights(tmp_path_factory) -> Path:
    """Random-init built-in-model weights (stored sampler: 2 steps, 2 chunks) for pipeline tests."""
    from pipeline_testkit import write_random_tiny_weights

    return write_random_tiny_weights(tmp_path_factory.mktemp("tiny") / "weights", steps=2, num_chunks=2)


@pytest.fixture(scope="session")
def results_store(tmp_path_factory, tiny_weights) -> Path:
    """A real results store: every FIXTURE_RUNS setting run through the pipeline once (read-only for tests)."""
    from pipeline_testkit import build_results_fixture

    root = tmp_path_factory.mktemp("store")
    build_results_fixture(root / "results", tiny_weights)
    return root / "results"


@pytest.fixture
def host_reads(monkeypatch) -> list[str]:
    """Names of every tensor-to-host read (.item, .tolist, bool/float/int) made while the test runs: on a GPU
    each one is a device sync, which hot paths must avoid."""
    import torch

    reads: list[str] = []
    for name in ("item", "tolist", "__bool__", "__float__", "__int__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            reads.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return reads
