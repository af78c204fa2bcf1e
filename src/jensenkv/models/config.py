"""The model node of the config tree (``RunConfig.model``, configs/model/*.yaml).

``ModelConfig`` is composed from the families: the fields every model has (``ModelBase``) plus each registered
family's own node (``ModelFamily.node``), so adding a family adds its fields here without an edit. A family
refuses a value for a field it does not read, and checks its own fields (``ModelFamily.check``). Two families
that read the same field (``path``, ``height``, ...) must declare it with the same type and default.
"""
from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jensenkv.checks import check_choice, fail
from jensenkv.models.registry import FAMILIES, family
from jensenkv.quant.config import FLOAT_DTYPES

MODEL_DTYPES = tuple(FLOAT_DTYPES)


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def resolve_device(device: Any) -> str:
    """"auto" -> "cuda" when a GPU is visible, else "cpu"; "cuda[:n]" needs a visible GPU."""
    if device == "auto":
        return "cuda" if cuda_available() else "cpu"
    if not isinstance(device, str) or not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        fail("model.device", device, "use auto, cpu, cuda or cuda:<n>")
    if device.startswith("cuda") and not cuda_available():
        fail("model.device", device, "no CUDA device is visible on this machine; use auto or cpu")
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
ModelConfig = dataclasses.make_dataclass(
    "ModelConfig", [(name, hint, dataclasses.field(default=default)) for name, (hint, default) in
                    FAMILY_FIELDS.items()],
    bases=(ModelBase,), namespace={"__module__": __name__, "__doc__": ModelBase.__doc__ + (
        " Composed from the families' nodes: tiny (jensenkv.models.tiny), diffusers (SkyReels-V2 / Wan, "
        "jensenkv.models.wan), magi (MAGI-1, jensenkv.models.magi); each node's docstring says its fields.")})


def as_model_config(model: Any) -> Any:
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
