"""The package's layering (docs/ARCHITECTURE.md): no import circle anywhere, function-level imports included;
every import goes to the same layer or a lower one; nothing outside models/ branches on a model kind."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
# Bottom to top. A module may import its own layer and the layers below it, never one above.
LAYERS = (
    ("foundation", ("jensenkv", "checks", "devices", "exit_codes", "machine", "hashing", "readiness", "calibration", "quant", "correction")),
    ("cache", ("cache",)),
    ("attention", ("attention",)),
    ("generation", ("generation",)),
    ("models", ("models", "llm")),
    ("eval", ("eval",)),
    ("store", ("store",)),
    ("config and report", ("config", "report")),
    ("run", ("run",)),
    ("command lines", ("doctor", "calibration.fit", "calibration.__main__", "bench")),
)  # a dotted member places a package's module above its package (calibration: the file format is foundation)
KINDS = "tiny|diffusers|magi|worldplay"
KIND_BRANCH = re.compile("|".join((  # a test on model.kind, or on a "kind" compared with a family's name
    r"model\.kind\s*(==|!=|\bin\b|\bnot\s+in\b)",
    rf"\bkind[\"']?\)?\s*(==|!=)\s*[\"']({KINDS})[\"']",
    rf"[\"']({KINDS})[\"']\s*(==|!=)\s*[\w.]*\bkind\b",
    rf"\bkind[\"']?\)?\s+(not\s+)?in\s+[(\[{{][\"']({KINDS})[\"']",
)))


def modules(src: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under ``src``."""
    out = {}
    for path in src.rglob("*.py"):
        parts = path.relative_to(src).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph(src: Path, package: str = "jensenkv") -> dict[str, set[str]]:
    """Module -> the package's modules it imports, anywhere in its body (deferred imports count: they hide a
    circle, they do not remove it). Importing a package's submodule counts as importing that submodule only."""
    mods = modules(src)
    graph: dict[str, set[str]] = {m: set() for m in mods if m == package or m.startswith(package + ".")}
    for name in graph:
        is_pkg = mods[name].name == "__init__.py"
        for node in ast.walk(ast.parse(mods[name].read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                if target in graph and target != name and not name.startswith(target + "."):
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def layer_of(module: str) -> int:
    parts = module.split(".")[1:] or [module]
    for depth in range(len(parts), 0, -1):  # the longest listed prefix decides
        name = ".".join(parts[:depth])
        for level, (_, members) in enumerate(LAYERS):
            if name in members:
                return level
    raise AssertionError(f"{module} is in no layer of tests/test_layering.py LAYERS: add it where it belongs")


def test_the_package_has_no_import_cycle():
    assert cycles(import_graph(SRC)) == []


def test_a_planted_cycle_is_found_deferred_imports_included(tmp_path):
    pkg = tmp_path / "jensenkv"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "low.py").write_text("def f():\n    from jensenkv.sub.high import g  # deferred: still a circle\n")
    (pkg / "sub" / "high.py").write_text("from jensenkv import low\n\ndef g():\n    pass\n")
    (pkg / "leaf.py").write_text("from . import low\n")
    assert cycles(import_graph(tmp_path)) == [["jensenkv.low", "jensenkv.sub.high"]]


def test_every_import_goes_to_the_same_layer_or_below():
    graph = import_graph(SRC)
    upward = sorted(f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
                    for m, targets in graph.items() for t in targets if layer_of(t) > layer_of(m))
    assert upward == []


def kind_branches(root: Path, skip: tuple[str, ...] = ()) -> list[str]:
    hits = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[:1] in [(s,) for s in skip]:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if KIND_BRANCH.search(line):
                hits.append(f"{rel}:{number}: {line.strip()}")
    return hits


def test_nothing_outside_models_branches_on_a_model_kind():
    """Model knowledge lives in its family (jensenkv.models.<family>.family); everywhere else asks the family."""
    assert kind_branches(SRC / "jensenkv", skip=("models",)) == []
    assert kind_branches(REPO / "scripts") == []


@pytest.mark.parametrize("line", ['if model.kind == "tiny":', "if spec.model.kind != 'magi':",
                                  'if cfg.get("kind") == "diffusers":', 'x = 1 if "magi" == model.kind else 2',
                                  "elif self.model.kind in ('tiny', 'magi'):", 'if kind in ("tiny", "magi"):'])
def test_the_kind_branch_grep_catches_a_planted_branch(tmp_path, line):
    (tmp_path / "planted.py").write_text(f"def f(model, spec, cfg, self, kind):\n    {line}\n        pass\n")
    assert len(kind_branches(tmp_path)) == 1


def test_the_kind_branch_grep_leaves_other_kinds_alone(tmp_path):
    (tmp_path / "fine.py").write_text('if item.kind == "zip-raft":  # models.zip\n    family(model.kind).check(model)\n')
    assert kind_branches(tmp_path) == []
