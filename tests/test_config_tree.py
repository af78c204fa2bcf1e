"""The config tree is data: building a RunConfig reads no file, whatever the model and whatever it names; the
families compose ModelConfig; the resolve step is where files are read."""
from __future__ import annotations

import builtins
import contextlib
import dataclasses
import pathlib
import typing

import pytest

from jensenkv.attention.config import AttentionConfig
from jensenkv.cache import CacheSettings
from jensenkv.config.tree import RunConfig
from jensenkv.generation.config import GenerationConfig
from jensenkv.models import config as model_config
from jensenkv.models.config import ModelConfig, RunGenerationConfig
from jensenkv.models.family import ModelFamily
from jensenkv.models.magi.schedule import MagiScheduleConfig
from jensenkv.models.registry import FAMILIES, family
from jensenkv.quant.config import QuantConfig


def tiny_schedule() -> MagiScheduleConfig:  # the tiny preset's schedule: its null caption has 16 rows
    return MagiScheduleConfig(null_caption_tokens=8)


@contextlib.contextmanager
def file_accesses():
    """Yields the list of files touched (pathlib and open) while the block runs."""
    touched: list[str] = []
    originals = {name: getattr(pathlib.Path, name) for name in ("stat", "read_text", "read_bytes", "open")}
    real_open = builtins.open

    def recording(name):
        def method(self, *args, **kwargs):
            touched.append(f"{name} {self}")
            return originals[name](self, *args, **kwargs)
        return method

    def recording_open(file, *args, **kwargs):
        touched.append(f"open {file}")
        return real_open(file, *args, **kwargs)

    import huggingface_hub

    real_snapshot = huggingface_hub.snapshot_download

    def recording_snapshot(*args, **kwargs):
        touched.append(f"snapshot_download {args} {kwargs}")
        return real_snapshot(*args, **kwargs)

    try:
        for name in originals:
            setattr(pathlib.Path, name, recording(name))
        builtins.open, huggingface_hub.snapshot_download = recording_open, recording_snapshot
        yield touched
    finally:
        for name, method in originals.items():
            setattr(pathlib.Path, name, method)
        builtins.open, huggingface_hub.snapshot_download = real_open, real_snapshot


TREES = {
    "tiny, calibrated": lambda: RunConfig(model=ModelConfig(kind="tiny", device="cpu", weights_dir="/nowhere"),
                                          quant=QuantConfig(bits=2, group_size=32),
                                          attention=AttentionConfig(correction="taylor", calibration="/nowhere.json")),
    "diffusers": lambda: RunConfig(model=ModelConfig(kind="diffusers", device="cpu", transformer_class="WanTransformer3DModel",
                                                     path="Org/Not-Cached", height=64, width=64)),
    "magi": lambda: RunConfig(model=ModelConfig(kind="magi", device="cpu", preset="4.5B", path="/nowhere",
                                                height=720, width=720),
                              generation=RunGenerationConfig(magi=MagiScheduleConfig())),
}


@pytest.mark.parametrize("name", sorted(TREES))
def test_building_a_run_config_reads_no_file(name):
    TREES[name]()  # imports done once, outside the watch
    with file_accesses() as touched:
        tree = TREES[name]()
    assert touched == [] and tree.key.method == "rtn"


def test_the_watch_sees_a_file_read(tmp_path):
    (tmp_path / "x").write_text("x")
    with file_accesses() as touched:
        (tmp_path / "x").read_text()
    assert touched


def test_model_config_is_the_families_fields_plus_the_common_ones():
    own = {f for fam in FAMILIES.values() for f in fam.fields()}
    assert {f.name for f in dataclasses.fields(ModelConfig)} == {"kind", "name", "device", "dtype"} | own
    for fam in FAMILIES.values():
        others = own - set(fam.fields())
        with pytest.raises(ValueError, match=rf"kind={fam.kind} does not read it"):
            ModelConfig(kind=fam.kind, device="cpu", **{sorted(others)[0]: 1})


def _field_specs(node: type) -> dict[str, tuple]:
    """name -> (type, default) of a node dataclass (a default factory's value stands for its default)."""
    hints = typing.get_type_hints(node)
    return {f.name: (hints[f.name], f.default_factory() if f.default is dataclasses.MISSING else f.default)
            for f in dataclasses.fields(node)}


@pytest.mark.parametrize("composed, node_of", [(ModelConfig, lambda fam: fam.node),
                                               (RunGenerationConfig, lambda fam: fam.generation_node)])
def test_every_registered_familys_nodes_are_bases_and_shared_fields_agree(composed, node_of):
    nodes = [node_of(fam) for fam in FAMILIES.values() if node_of(fam) is not None]
    assert nodes and all(node in composed.__bases__ for node in nodes)
    merged = _field_specs(composed)
    for node in nodes:  # a field two families share (or the composed node and a family) has one type and default
        for name, spec in _field_specs(node).items():
            assert merged[name] == spec, (node.__name__, name)


def test_the_composed_nodes_keep_the_field_order_run_ids_were_hashed_in():
    """ModelBase then each family's fields in registry order; the loop's fields then each family's node."""
    model_order = [f.name for f in dataclasses.fields(model_config.ModelBase)]
    generation_order = [f.name for f in dataclasses.fields(GenerationConfig)]
    for fam in FAMILIES.values():
        model_order += [name for name in fam.fields() if name not in model_order]
        if fam.generation_node is not None:
            generation_order.append(fam.generation_key())
    assert [f.name for f in dataclasses.fields(ModelConfig)] == model_order
    assert [f.name for f in dataclasses.fields(RunGenerationConfig)] == generation_order
    assert list(ModelConfig(device="cpu").to_dict()) == [n for n in model_order if n not in model_config.LATER_FIELDS]
    assert list(RunGenerationConfig().sampling()) == [n for n in generation_order if n not in ("batch_size", "worldplay")]


def test_two_families_declaring_one_field_differently_are_refused(monkeypatch):
    @dataclasses.dataclass
    class Clash:
        path: int = 0  # the other families' path is Optional[str] = None

    class ClashFamily(ModelFamily):
        kind = "clash"
        node = Clash

    monkeypatch.setitem(FAMILIES, "clash", ClashFamily())
    with pytest.raises(TypeError, match="model field 'path'"):
        model_config.family_fields()


def test_unknown_kind_names_the_registered_families():
    with pytest.raises(ValueError, match=r"model.kind='nope' is not allowed: use one of \('tiny', 'diffusers', 'magi', 'worldplay'\)"):
        ModelConfig(kind="nope")
    with pytest.raises(ValueError, match="model.kind='nope'"):
        family("nope")


def test_a_family_refuses_a_backend_it_cannot_use(monkeypatch):
    """Every family runs every backend today (MAGI-1's GQA caches feed the Triton kernel their stored KV heads),
    so the refusal path is kept tested on MAGI-1 marked as unable: one line, when the tree is built, naming
    attention.backend, the value, the reason and the backends the family allows."""
    magi = ModelConfig(kind="magi", device="cpu", preset="tiny")
    assert not any(fam.refused_backends for fam in FAMILIES.values())
    for backend in ("triton", "cached", "flex", "reference"):
        RunConfig(model=magi, generation=RunGenerationConfig(magi=tiny_schedule()),
                  attention=AttentionConfig(backend=backend))
    monkeypatch.setattr(type(family("magi")), "refused_backends", {"triton": "a reason"})
    with pytest.raises(ValueError, match=r"^attention.backend='triton' is not allowed: model.kind=magi cannot use it "
                                         r"\(a reason\); it allows \('cached', 'reference', 'flex'\)$"):
        RunConfig(model=magi, generation=RunGenerationConfig(magi=tiny_schedule()),
                  attention=AttentionConfig(backend="triton"))


@pytest.mark.parametrize("quant, cache, message", [
    (QuantConfig(method="qvg"), {}, r"not quant.method='qvg' \(keys\)"),
    (QuantConfig(bits=3), {}, r"bits in \(2, 4, 8\), .*not quant.bits=3 \(keys\)"),
    (QuantConfig(dither="subtractive"), {}, r"not quant.dither=subtractive"),
    (QuantConfig(smoothing="channel_mean"), {}, r"not quant.smoothing=channel_mean"),
])
def test_the_triton_backend_refuses_a_cache_it_cannot_read_before_any_model_loads(quant, cache, message):
    tiny = ModelConfig(kind="tiny", device="cpu")
    with pytest.raises(ValueError, match=r"^attention.backend='triton' is not allowed: it .*" + message):
        RunConfig(model=tiny, quant=quant, cache=CacheSettings(**cache), attention=AttentionConfig(backend="triton"))
    RunConfig(model=tiny, quant=quant, cache=CacheSettings(**cache), attention=AttentionConfig(backend="cached"))
    for ok in (QuantConfig(bits=2), QuantConfig(bits=4, rotation="hadamard"), QuantConfig(method="none")):
        RunConfig(model=tiny, quant=ok, attention=AttentionConfig(backend="triton"))
    RunConfig(model=tiny, cache=CacheSettings(values="none"), attention=AttentionConfig(backend="triton"))


@pytest.mark.parametrize("overrides, message", [
    ({"model_overrides": {"num_layer": 2}}, r"model.model_overrides=.*\['num_layer'\] are not MAGI-1 model fields"),
    ({"model_overrides": {"num_layers": 0}}, r"model.model_overrides.num_layers=0 is not allowed"),
    ({"preset": "huge"}, r"model.preset='huge' is not allowed: use one of"),
    ({"seed": -1}, r"model.seed=-1 is not allowed"),
])
def test_magi_fields_are_checked_when_the_tree_is_built(overrides, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(kind="magi", device="cpu", **{"preset": "tiny", **overrides})


def test_resolve_reads_the_geometry_the_checks_need(tmp_path):
    """A group that does not divide the tiny model's head dim passes the pure tree and is refused on resolve."""
    from jensenkv.config.resolve import resolve

    tree = RunConfig(model=ModelConfig(kind="magi", device="cpu", preset="tiny", latent_height=8),
                     generation=RunGenerationConfig(magi=tiny_schedule()), quant=QuantConfig(bits=2, group_size=64))
    with pytest.raises(ValueError, match="must divide head_dim=32"):
        resolve(tree)
    spec = resolve(dataclasses.replace(tree, quant=QuantConfig(bits=2, group_size=32)))
    assert spec.geometry.head_dim == 32 and spec.geometry.kv_heads == 2 and spec.geometry.layers == 2
    assert spec.geometry.tokens_per_chunk == spec.generation.frames_per_chunk * 4 * 4  # 8 x 8 latent, patch 2


def test_content_recovery_is_limited_to_the_built_in_model_by_default():
    """A family provides content recovery only when it says so (the built-in model's prompt grammar)."""
    assert family("tiny").metric_limits == {}
    assert all("content" in fam.metric_limits for kind, fam in FAMILIES.items() if kind != "tiny")


@pytest.mark.parametrize("value", [0, -1, "many", 1.5, True])
def test_a_bad_batch_size_is_one_line(value):
    with pytest.raises(ValueError, match=r"generation.batch_size=.* is not allowed: use \"auto\" or an integer >= 1"):
        RunGenerationConfig(batch_size=value)


def test_a_family_that_cannot_batch_refuses_a_batch(monkeypatch):
    """Every family but HY-WorldPlay (one trajectory and memory per video) batches, so the refusal path is also
    tested on MAGI-1 marked as unable: batch_size > 1 is refused when the tree is built, and auto means one
    video at a time (WorldPlay's own refusal: tests/models/test_worldplay_family.py)."""
    from jensenkv.config.resolve import resolve

    magi = ModelConfig(kind="magi", device="cpu", preset="tiny")
    assert [kind for kind, fam in FAMILIES.items() if not fam.batches] == ["worldplay"]
    RunConfig(model=magi, generation=RunGenerationConfig(magi=tiny_schedule(), batch_size=2))
    monkeypatch.setattr(type(family("magi")), "batches", False)
    with pytest.raises(ValueError, match=r"generation.batch_size=2 is not allowed: model.kind=magi generates one "
                                         r"video at a time"):
        RunConfig(model=magi, generation=RunGenerationConfig(magi=tiny_schedule(), batch_size=2))
    for size in ("auto", 1):
        RunConfig(model=magi, generation=RunGenerationConfig(magi=tiny_schedule(), batch_size=size))
    auto = resolve(RunConfig(model=magi, generation=RunGenerationConfig(magi=tiny_schedule())))
    assert family("magi").auto_batch_size(auto, "cpu") == 1  # auto: one video at a time there


def test_the_batch_size_changes_no_run_id(tmp_path):
    from jensenkv.config.resolve import resolve

    ids = {size: resolve(RunConfig(model=ModelConfig(kind="tiny", device="cpu"),
                                   generation=RunGenerationConfig(batch_size=size))).run_id for size in ("auto", 1, 7)}
    assert len(set(ids.values())) == 1, ids


def test_auto_batch_size_on_a_cpu_is_the_familys_measured_default():
    from jensenkv.config.resolve import resolve

    spec = resolve(RunConfig(model=ModelConfig(kind="tiny", device="cpu")))
    assert family("tiny").auto_batch_size(spec, "cpu") == family("tiny").cpu_batch_size > 1
    magi = resolve(RunConfig(model=ModelConfig(kind="magi", device="cpu", preset="tiny"),
                             generation=RunGenerationConfig(magi=tiny_schedule())))
    assert family("magi").auto_batch_size(magi, "cpu") == family("magi").cpu_batch_size > 1
