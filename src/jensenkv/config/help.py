"""``python -m jensenkv.run --help``: every field of the config tree, its value and its one-line doc.

The doc of a field is the comment beside it in its dataclass (continued on comment-only lines right below it),
else the ``name: ...`` line of the class docstring: the schema's own words, so help never drifts from it.
configs/config.yaml's ``hydra.help.template`` places the list with ``${jensenkv_fields:}``, a resolver that
reads the values from the composed config (``_root_``).
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import io
import re
import tokenize
import typing
from typing import Any

from jensenkv import exit_codes

RESOLVER = "jensenkv_fields"
EXIT_RESOLVER = "jensenkv_exit_codes"  # the exit-status line of --help (jensenkv.exit_codes)


@functools.lru_cache(maxsize=None)
def field_docs(cls: type) -> dict[str, str]:
    """{field: its one-line doc} of dataclass ``cls`` (and its dataclass bases), from its source comments."""
    docs: dict[str, str] = {}
    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):
        docs.update(_docstring_docs(klass))
        docs.update(_comment_docs(klass))
    return docs


def _comment_docs(cls: type) -> dict[str, str]:
    """The comment beside each field, continued on the comment-only lines below it that are indented further
    than the field (a comment at the field's own indent belongs to what follows)."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):  # made at run time (models.config.ModelConfig): its bases and nodes say it
        return {}
    names = {f.name for f in dataclasses.fields(cls)}
    comments = {t.start[0]: t for t in tokenize.generate_tokens(io.StringIO(source).readline)
                if t.type == tokenize.COMMENT}
    lines = source.splitlines()
    docs: dict[str, str] = {}
    for row, line in enumerate(lines, 1):
        match = re.match(r"    (\w+)\s*:", line)
        if not match or match.group(1) not in names:
            continue
        if row not in comments:  # no comment beside it: the comment-only lines right above it, if any
            above = row - 1
            while above in comments and lines[above - 1].startswith("    #"):
                above -= 1
            if above < row - 1:
                docs[match.group(1)] = " ".join(comments[r].string.lstrip("#").strip() for r in range(above + 1, row))
            continue
        text = [comments[row].string.lstrip("#").strip()]
        below = row + 1
        while below in comments and lines[below - 1].lstrip().startswith("#") \
                and len(lines[below - 1]) - len(lines[below - 1].lstrip()) > 4:
            text.append(comments[below].string.lstrip("#").strip())
            below += 1
        docs[match.group(1)] = " ".join(text)
    return docs


def _docstring_docs(cls: type) -> dict[str, str]:
    """``name: text`` (or ``a / b: text``) paragraphs of the class docstring, first sentence."""
    names = {f.name for f in dataclasses.fields(cls)}
    docs: dict[str, str] = {}
    for match in re.finditer(r"^\s*([\w /*]+?):\s+(.+?)(?=\n\s*\n|\n\s*[\w /*]+?:\s|\Z)", inspect.getdoc(cls) or "",
                             re.M | re.S):
        text = " ".join(match.group(2).split())
        for name in (n.strip() for n in match.group(1).split("/")):
            # "fov_*: ..." documents every field with that prefix
            for field_name in (n for n in names if n == name or (name.endswith("*") and n.startswith(name[:-1]))):
                docs.setdefault(field_name, text)
    return docs


def _node_type(hint: Any) -> Any:
    """X for Optional[X], else the hint."""
    if typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0] if len(args) == 1 else hint
    return hint


def one_line(doc: str, width: int = 110) -> str:
    """The first sentence of ``doc``, at most ``width`` characters."""
    first = re.split(r"(?<!e\.g\.)(?<!i\.e\.)(?<=[.;])\s", doc, maxsplit=1)[0].rstrip(".;")
    return first if len(first) <= width else first[: width - 3].rstrip() + "..."


def schema_fields(cls: type, prefix: str = "", kind: str | None = None,
                  extra: tuple[type, ...] = ()) -> list[tuple[str, str]]:
    """(dotted key, one-line doc) of every leaf field under dataclass ``cls``; ``extra`` classes also document
    its fields (the families' nodes for the model node, family ``kind``'s last, so its words win)."""
    docs: dict[str, str] = {}
    for source in (cls, *extra):  # cls's own bases first (ModelConfig's are every family), so extra's words win
        docs.update({k: v for k, v in field_docs(source).items() if v})
    hints = typing.get_type_hints(cls)
    rows: list[tuple[str, str]] = []
    for f in dataclasses.fields(cls):
        node = _node_type(hints[f.name])
        if isinstance(node, type) and dataclasses.is_dataclass(node):
            rows.extend(schema_fields(node, f"{prefix}{f.name}.", kind, _nodes_of(node, kind)))
        else:
            rows.append((f"{prefix}{f.name}", one_line(docs.get(f.name, ""))))
    return rows


def _nodes_of(node: type, kind: str | None) -> tuple[type, ...]:
    """Classes that document a node's fields beside the node itself: the model node's come from the families."""
    from jensenkv.models.config import ModelConfig
    from jensenkv.models.registry import FAMILIES

    if node is not ModelConfig:
        return ()
    return tuple(fam.node for name, fam in sorted(FAMILIES.items(), key=lambda item: item[0] == kind))


def fields_help(root: Any) -> str:
    """The help's field list: ``key = value  doc`` lines, values from the composed config ``root``."""
    from omegaconf import OmegaConf

    from jensenkv.config.tree import RunConfig

    lines = []
    for key, doc in schema_fields(RunConfig, kind=OmegaConf.select(root, "model.kind", default=None)):
        try:
            value = OmegaConf.select(root, key, throw_on_missing=False)
            value = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        except Exception:  # noqa: BLE001 - an interpolation this machine cannot resolve: show none
            value = "?"
        shown = "null" if value is None else str(value)
        if len(shown) > 40:
            shown = shown[:37] + "..."
        lines.append(f"  {key} = {shown}" + (f"  # {doc}" if doc else ""))
    return "\n".join(lines).replace("$", "$$")  # Hydra fills the template with string.Template


def register_help_resolver() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, lambda *, _root_: fields_help(_root_))
    if not OmegaConf.has_resolver(EXIT_RESOLVER):
        OmegaConf.register_new_resolver(EXIT_RESOLVER, lambda: exit_codes.EPILOG)
