"""The HY-WorldPlay cache-memory benchmark at a toy geometry: its replay of the memory writes and its rows' logic
(not the 480p numbers, which `make bench` measures)."""
from __future__ import annotations

import pytest

from jensenkv.bench import memory_rows, suite
from jensenkv.bench.plan import BENCHMARKS, MIB, quick_plan
from jensenkv.bench.worldplay_memory import TOY, WORLDPLAY_480P, held
from jensenkv.models.worldplay.cache import memory_bytes


def test_480p_geometry_is_worldplays():
    g = WORLDPLAY_480P
    assert (g.layers, g.heads, g.head_dim, g.frame_tokens) == (54, 16, 128, 1560)
    assert [g.held_frames(c, "rebuild") for c in range(8)] == [0, 4, 8, 12, 16, 20, 20, 20]
    assert [g.held_frames(c, "append") for c in range(8)] == [0, 4, 8, 12, 16, 20, 24, 28]


@pytest.mark.parametrize("quant", ["bf16", "rtn"])
@pytest.mark.parametrize("memory", ["rebuild", "append"])
def test_replay_holds_the_frames_memory_bytes_counts(quant, memory):
    r = held(TOY, quant, memory, measured_layers=2)
    frames = TOY.held_frames(TOY.chunks - 1, memory)
    assert r["frames"] == frames == (TOY.memory_frames if memory == "rebuild" else 12)
    assert r["stored"] == r["memory_bytes"]  # measured nbytes of the real caches == the settings' count
    assert r["bf16"] == r["memory_bytes_bf16"] == 2 * 2 * 2 * 2 * TOY.heads * frames * TOY.frame_tokens * TOY.head_dim
    assert r["chunk_bytes_min"] == r["chunk_bytes_max"]
    assert r["chunk_bytes_max"] * frames // TOY.chunk_frames == r["stored"]  # every group a full chunk
    # sized as generation sizes the caches (reserve_memory): the buffers hold exactly what is stored
    assert r["live"] == r["held_nbytes"] == r["stored"]
    ratio = r["stored"] / r["bf16"]
    assert ratio == (1.0 if quant == "bf16" else 2.75 / 16)  # INT2 g=32: 2 bits + fp16 step + uint8 zero per 32
    # control: a replay holding one chunk more or less would not match the count
    for wrong in (frames - TOY.chunk_frames, frames + TOY.chunk_frames):
        cfg_bytes = memory_bytes(2, TOY.heads, TOY.head_dim, _cache(quant), wrong, TOY.frame_tokens)["stored"]
        assert cfg_bytes != r["stored"]


def _cache(quant):
    from jensenkv.bench.presets import preset
    from jensenkv.bench.worldplay_memory import QUANTS

    return preset(quant, TOY.head_dim, **dict(QUANTS)[quant])


def test_rows_scale_the_measured_layers_and_compare_with_memory_bytes(monkeypatch):
    calls = []

    def fake_measure(kind, quant, memory, *args, module, in_process):  # one block measured, as the full run does
        calls.append((kind, quant, memory, args))
        assert module == "jensenkv.bench.worldplay_memory" and in_process  # the quick plan starts no process
        return held(TOY, quant, memory, measured_layers=1)

    monkeypatch.setattr(memory_rows, "measure", fake_measure)
    plan = quick_plan()
    rows = memory_rows.worldplay_rows(plan)
    assert [c[:3] for c in calls] == [("held", q, m) for q in ("bf16", "rtn") for m in ("rebuild", "append")]
    assert all(c[3] == ("--toy",) for c in calls)
    assert len(rows) == 4 * 7 and {r["benchmark"] for r in rows} == {"worldplay_cache_memory"}
    by = {r["config"]: r for r in rows}
    for quant in ("bf16 ", "rtn bits=2 group_size=32"):
        for memory, frames in (("rebuild", 8), ("append", 12)):
            prefix = f"HY-WorldPlay toy {quant.strip()}, {memory} ({frames} frames held), 1 layer measured x 2: "
            stored = by[prefix + "held, stored (nbytes)"]["value"]
            want = memory_bytes(TOY.layers, TOY.heads, TOY.head_dim, _cache(quant.split()[0]), frames,
                                TOY.frame_tokens)["stored"]
            assert stored * MIB == pytest.approx(want)  # one block x 2 layers == the 2-layer count
            assert by[prefix + "memory_bytes (settings)"]["value"] == pytest.approx(stored)
            assert by[prefix + "one chunk's K+V, both streams"]["value"] * frames / TOY.chunk_frames \
                == pytest.approx(stored)
            assert by[prefix + "RSS growth / memory_bytes"]["unit"] == "ratio"
    assert any(n.startswith("worldplay_cache_memory:") for n in plan.notes)


def test_benchmark_is_in_the_suite():
    assert "worldplay_cache_memory" in BENCHMARKS and "worldplay_cache_memory" in suite.RUNNERS
