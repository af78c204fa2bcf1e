"""The run path imports only what a run uses, and a run of the built-in model neither reaches the network nor
warns at import, nor imports diffusers or transformers (its transformer is models.wan.dit; diffusers would import
bitsandbytes, whose CPU backend asks the Hub for a kernel)."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

# Loaded only by what needs them: tables (pandas), the flex backend (flex_attention: sympy, torch.fx), the Triton
# backend (triton); bitsandbytes by nothing
HEAVY = ("pandas", "torch.nn.attention.flex_attention", "triton", "bitsandbytes")

# In the child: every Python-level socket lookup or connect (audit events), and what was imported, on stderr at exit
PROBE = """
import atexit, json, runpy, sys
net = []
sys.addaudithook(lambda event, args: net.append([event, repr(args)[:200]])
                 if event in ("socket.getaddrinfo", "socket.gethostbyname", "socket.connect") else None)
atexit.register(lambda: print("PROBE " + json.dumps({"net": net, "bnb": sys.modules.get("bitsandbytes") is not None,
                                                    "libraries": sorted({m.split(".")[0] for m in sys.modules}
                                                                        & {"diffusers", "transformers"})}),
                              file=sys.stderr))
sys.argv = ["jensenkv.run", *sys.argv[1:]]
runpy.run_module("jensenkv.run", run_name="__main__", alter_sys=True)
"""


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}


def test_importing_the_run_cli_loads_no_table_kernel_or_quantization_library():
    code = f"import sys, jensenkv.run.cli; print([m for m in {HEAVY!r} if sys.modules.get(m) is not None])"
    out = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout


def imported_modules(statement: str) -> list[str]:
    """Every module ``statement`` imports in a fresh interpreter, from ``python -X importtime``."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", statement], env=_env(), capture_output=True,
                         text=True, timeout=120, check=True)
    return [line.rsplit("|", 1)[1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")
            and not line.rstrip().endswith("| imported package")]


def test_importing_the_config_loads_no_pandas():
    """The config tree is built before any table: pandas is loaded by the report alone (torch's own tqdm still
    imports its ``tqdm._tqdm_pandas`` hook module, which imports no pandas)."""
    modules = imported_modules("import jensenkv.config")
    assert "jensenkv.config" in modules and "jensenkv.config.logger" in modules
    assert [m for m in modules if m.split(".")[0] == "pandas"] == []


def test_the_store_and_the_runner_load_no_pandas_at_import():
    modules = imported_modules("import jensenkv.store.results, jensenkv.store.llm, jensenkv.run.runner, "
                               "jensenkv.run.wandb, jensenkv.eval.scoring")
    assert "jensenkv.store.record_check" in modules
    assert [m for m in modules if m.split(".")[0] in ("pandas", "wandb")] == []


def module_level_pandas(src: Path, above: tuple[str, ...]) -> list[str]:
    """Modules under ``src`` (those of the packages ``above`` left out) importing pandas in their module body."""
    found = []
    for path in sorted(src.rglob("*.py")):
        if path.relative_to(src).parts[0] in above:
            continue
        for node in ast.parse(path.read_text()).body:
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(name.split(".")[0] == "pandas" for name in names):
                found.append(str(path.relative_to(src)))
    return found


def test_nothing_below_the_report_imports_pandas_at_module_level(tmp_path):
    src = Path(__file__).resolve().parents[1] / "src" / "jensenkv"
    above = ("report", "run", "bench", "doctor.py")  # the report and the layers above it (calibration.fit: none)
    assert module_level_pandas(src, above) == []
    (tmp_path / "planted.py").write_text("import pandas as pd\n")
    (tmp_path / "lazy.py").write_text("def f():\n    import pandas\n")
    assert module_level_pandas(tmp_path, ()) == ["planted.py"]


def test_the_import_listing_sees_pandas_once_it_is_imported():
    assert "pandas" in imported_modules("import jensenkv.report.store_frame, pandas")


def test_a_built_in_model_run_imports_no_diffusers_looks_up_no_host_and_warns_nothing(tmp_path: Path):
    results = tmp_path / "results"
    args = ["model.device=cpu", "generation.steps=2", "generation.num_chunks=2", "eval.num_prompts=1",
            "eval.metrics=[psnr]", "logger=disabled", f"paths.results_dir={results}",
            f"hydra.run.dir={tmp_path / 'out'}"]
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=tmp_path, env=_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list(results.glob("runs/*/record.json")), "the run wrote no record"
    probe = json.loads(proc.stderr.rsplit("PROBE ", 1)[1])
    assert probe == {"net": [], "bnb": False, "libraries": []}
    output = proc.stdout + proc.stderr
    assert "kernels-community" not in output and "bitsandbytes" not in output, output[-3000:]
