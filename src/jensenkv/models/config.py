"""The two nodes of the config tree the families compose: ``model`` (``ModelConfig``, configs/model/*.yaml) and
``generation`` (``RunGenerationConfig``).

``ModelConfig`` is a declared class whose bases are the fields every model has (``ModelBase``) and each
registered family's own node (``ModelFamily.node``); ``RunGenerationConfig``'s are the loop's node
(``jensenkv.generation.config.GenerationConfig``) and each family's generation node
(``ModelFamily.generation_node``: MAGI-1's ``generation.magi``, HY-WorldPlay's ``generation.worldplay``). A new
family adds its nodes to these bases (tests/test_config_tree.py checks that every registered one is there). A
family refuses a value for a field it does not read, and checks its own fields (``ModelFamily.check``). Two
families that read the same field (``path``, ``height``, ...) must declare it with the same type and default.

Dataclass fields come in reverse order of the bases (the last base's first), so the bases are listed last
family first: the fields then read ModelBase, tiny, diffusers, magi, worldplay (and the loop's, then magi's,
then worldplay's), the order the committed run ids were hashed in.
"""
from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from jensenkv.checks import check_choice, fail
from jensenkv.devices import cuda_available, where
from jensenkv.generation.config import GenerationConfig
from jensenkv.models.magi.family import MagiNode
from jensenkv.models.magi.schedule import MagiGenerationNode
from jensenkv.models.registry import FAMILIES, family
from jensenkv.models.tiny.family import TinyNode
from jensenkv.models.wan.family import WanNode
from jensenkv.models.worldplay.node import WorldPlayNode
from jensenkv.models.worldplay.settings import WorldPlayGenerationNode
from jensenkv.quant.config import FLOAT_DTYPES

MODEL_DTYPES = tuple(FLOAT_DTYPES)


def resolve_device(device: Any) -> str:
    """"auto" -> "cuda" when a GPU is visible, else "cpu"; "cuda[:n]" needs a visible GPU. Visible where the run
    will run (``jensenkv.devices``: this host, or the node a SLURM job is planned for)."""
    if device == "auto":
        return "cuda" if cuda_available() else "cpu"
    if not isinstance(device, str) or not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        fail("model.device", device, "use auto, cpu, cuda or cuda:<n>")
    if device.startswith("cuda") and not cuda_available():
        fail("model.device", device, f"no CUDA device is visible {where()}; use auto or cpu")
    return device


@dataclass
class ModelBase:
    """Which network runs, on what (the fields every family reads)."""

    kind: str = "tiny"                 # the family (jensenkv.models.registry.FAMILIES)
    name: str = "tiny"                 # the model label of the results tables (configs/model/<name>.yaml)
    device: str = "auto"               # auto (cuda if available, else cpu) | cpu | cuda | cuda:<n>
    dtype: str = "float32"             # transformer and text encoder

    def __post_init__(self) -> None:
        check_choice("model.kind", self.kind, tuple(FAMILIES))
        if not isinstance(self.name, str) or not self.name:
            fail("model.name", self.name, "must be a non-empty string")
        check_choice("model.dtype", self.dtype, MODEL_DTYPES)
        self.device = resolve_device(self.device)
        own = family(self.kind)
        for key in sorted(set(FAMILY_FIELDS) - set(own.fields())):
            if getattr(self, key) is not None:
                fail(f"model.{key}", getattr(self, key), f"kind={self.kind} does not read it; leave it null")
        own.check(self)

    def to_dict(self) -> dict:
        """Every field, but those only later families declare (``LATER_FIELDS``) only when set, so a model
        that leaves them null keeps its run id."""
        values = dataclasses.asdict(self)
        return {k: v for k, v in values.items() if not (k in LATER_FIELDS and v is None)}


def family_fields() -> dict[str, tuple[Any, Any]]:
    """Every family's fields: name -> (type, default); a field two families declare differently is an error."""
    merged: dict[str, tuple[Any, Any]] = {}
    for fam in FAMILIES.values():
        hints = typing.get_type_hints(fam.node)
        for f in dataclasses.fields(fam.node):
            entry = (hints[f.name], f.default)
            if merged.setdefault(f.name, entry) != entry:
                raise TypeError(f"model field {f.name!r}: family {fam.kind!r} declares {entry}, another "
                                f"{merged[f.name]}; a shared field needs one type and default")
    return merged


FAMILY_FIELDS = family_fields()
# fields only families added after the committed run ids declare (``ModelFamily.late``): they enter a model's
# identity only when set, so every earlier model keeps its run id
LATER_FIELDS = frozenset(FAMILY_FIELDS) - {f.name for fam in FAMILIES.values() if not fam.late
                                           for f in dataclasses.fields(fam.node)}


@dataclass
class ModelConfig(WorldPlayNode, MagiNode, WanNode, TinyNode, ModelBase):
    """Which network runs, on what: ``ModelBase``'s fields (kind, name, device, dtype) plus every family's node:
    tiny (``TinyNode``, jensenkv.models.tiny), diffusers (``WanNode``: SkyReels-V2 / Wan, jensenkv.models.wan),
    magi (``MagiNode``: MAGI-1, jensenkv.models.magi) and worldplay (``WorldPlayNode``: HY-WorldPlay,
    jensenkv.models.worldplay); each node's docstring says its fields. A field the model's kind does not read
    stays null."""


@dataclass
class RunGenerationConfig(WorldPlayGenerationNode, MagiGenerationNode, GenerationConfig):
    """The run's generation node: the loop's ``GenerationConfig`` plus every family's own node, ``magi``
    (``MagiGenerationNode``, jensenkv.models.magi.schedule) and ``worldplay`` (``WorldPlayGenerationNode``,
    jensenkv.models.worldplay.settings); the model's family requires its own and refuses the others."""

    # the late families' generation fields (``ModelFamily.late``) enter run ids only when set
    LATER_FIELDS: ClassVar[tuple[str, ...]] = tuple(
        fam.generation_key() for fam in FAMILIES.values() if fam.late and fam.generation_node is not None)

    def __post_init__(self) -> None:
        for base in reversed(RunGenerationConfig.__bases__):  # the loop's checks first, then each family's
            base.__post_init__(self)


def as_model_config(model: Any) -> ModelConfig:
    """A ModelConfig from itself or a mapping of its fields (a Hydra node, a dict); unknown keys are errors."""
    if isinstance(model, ModelConfig):
        return model
    if not isinstance(model, Mapping):
        raise ValueError(f"model config={model!r} is not allowed: a ModelConfig or a mapping of its fields")
    values = {k: v for k, v in dict(model).items() if k != "_target_"}
    allowed = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(values) - allowed)
    if unknown:
        raise ValueError(f"model config keys {unknown} are not allowed; allowed: {sorted(allowed)}")
    return ModelConfig(**values)
