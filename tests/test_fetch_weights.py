"""`make fetch-weights` with the network mocked: every file lands where the consuming code reads it."""
from __future__ import annotations

import hashlib
import json
import importlib.util
import subprocess
import zipfile
from pathlib import Path

import pytest
import torch

from jensenkv.eval.vbench import DIMENSION_FILES, dimension_weight_paths

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fw(monkeypatch):
    """scripts/fetch_weights.py as a module (dataclasses need it in sys.modules while it loads)."""
    import sys

    spec = importlib.util.spec_from_file_location("fetch_weights", ROOT / "scripts" / "fetch_weights.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "fetch_weights", module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def caches(tmp_path, monkeypatch):
    """Empty $TORCH_HOME and VBench cache in tmp_path (VBench freezes its cache dir at import: patch it)."""
    import vbench.utils

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setenv("VBENCH_CACHE_DIR", str(tmp_path / "vb"))
    monkeypatch.setattr(vbench.utils, "CACHE_DIR", str(tmp_path / "vb"))
    return tmp_path


def _fake_download(calls: list):
    """Stands in for torch.hub.download_url_to_file: records the call, writes what the URL would hold."""

    def download(url, dst, hash_prefix=None, progress=True):
        calls.append((url, hash_prefix))
        if url.endswith("dino/archive/refs/heads/main.zip"):
            with zipfile.ZipFile(dst, "w") as z:
                z.writestr("dino-main/hubconf.py", "dependencies = ['torch']\n")
                z.writestr("dino-main/vision_transformer.py", "")
        elif url.endswith("models.zip"):
            with zipfile.ZipFile(dst, "w") as z:
                z.writestr("models/raft-things.pth", b"raft")
        else:
            torch.save({"weight": torch.zeros(2)}, dst)

    return download


def test_planned_destinations_are_the_paths_the_consumers_read(fw, caches, monkeypatch):
    import vbench.utils
    from torchvision.models import AlexNet_Weights

    calls: list = []
    monkeypatch.setattr(torch.hub, "download_url_to_file", _fake_download(calls))
    dims = list(DIMENSION_FILES)
    assert fw.main(["--only", "lpips", "vbench", "--lpips-net", "alex", "--vbench-dims", *dims]) == 0

    # our own table of what each dimension reads is filled ...
    for dim in dims:
        assert all(p.is_file() for p in dimension_weight_paths(dim)), dim
    # ... and VBench's own loader finds every file it checks: it would shell out to wget / git otherwise
    def no_download(*args, **kwargs):
        raise AssertionError(f"VBench tried to download: {args}")

    monkeypatch.setattr(subprocess, "run", no_download)
    submodules = vbench.utils.init_submodules(dims, local=True)
    dino = submodules["subject_consistency"]
    assert Path(dino["repo_or_dir"], "hubconf.py").is_file()
    # DINO's hubconf ignores VBench's `path` and calls load_state_dict_from_url(<its URL>): the torch hub
    # copy is what it reads; VBench's copy is the same file
    monkeypatch.setattr(torch.hub, "download_url_to_file", no_download)
    assert "weight" in torch.hub.load_state_dict_from_url(fw.DINO_URL, map_location="cpu")
    hub_dino = Path(torch.hub.get_dir()) / "checkpoints" / "dino_vitbase16_pretrain.pth"
    assert hub_dino.is_file() and hub_dino.samefile(dino["path"])
    # torchvision (hence lpips) finds the AlexNet backbone without a download
    assert "weight" in torch.hub.load_state_dict_from_url(AlexNet_Weights.IMAGENET1K_V1.url, map_location="cpu")
    # CLIP comes from the mirror first, checked against the SHA256 in OpenAI's original URL
    clip_calls = {url.rsplit("/", 1)[1]: (url, sha) for url, sha in calls if url.endswith((".pt",))}
    for name, sha in fw.CLIP_SHA256.items():
        url, expected = clip_calls[name]
        assert url.startswith("https://huggingface.co/") and expected == sha
        assert sha in dict(fw.VBENCH_SOURCES)[f"clip_model/{name}"].urls[1]  # the hash of the original URL


def test_a_second_run_fetches_nothing(fw, caches, monkeypatch):
    calls: list = []
    monkeypatch.setattr(torch.hub, "download_url_to_file", _fake_download(calls))
    assert fw.main(["--only", "vbench", "--vbench-dims", "subject_consistency"]) == 0
    first = len(calls)
    assert fw.main(["--only", "vbench", "--vbench-dims", "subject_consistency"]) == 0
    assert first == 2 and len(calls) == first  # the DINO repo and checkpoint, once


def test_checksum_mismatch_is_rejected_and_the_next_source_used(fw, tmp_path):
    """Real torch.hub downloads from file:// URLs: a file whose SHA256 differs is never put in place."""
    good, bad = tmp_path / "good.pt", tmp_path / "bad.pt"
    good.write_bytes(b"the real weights")
    bad.write_bytes(b"something else")
    sha = hashlib.sha256(good.read_bytes()).hexdigest()
    target = tmp_path / "cache" / "clip_model" / "ViT-B-32.pt"
    item = fw.Item("clip", target, bad.as_uri(), urls=(bad.as_uri(), good.as_uri()), sha256=sha)
    fw.fetch(item)
    assert target.read_bytes() == b"the real weights"
    target.unlink()
    only_bad = fw.Item("clip", target, bad.as_uri(), urls=(bad.as_uri(), (tmp_path / "absent.pt").as_uri()),
                       sha256=sha)
    with pytest.raises(RuntimeError, match=f"expected SHA256 {sha}"):
        fw.fetch(only_bad)
    assert not target.exists() and list(target.parent.iterdir()) == []


def test_models_are_fetched_into_the_cache_the_loader_reads(fw, tmp_path, monkeypatch):
    """A fake Hub writes the cache layout; the loader's own lookup (local_files_only) then finds it."""
    import huggingface_hub

    from jensenkv.doctor import check_model
    from jensenkv.models.wan import resolve_local_dir

    real_snapshot = huggingface_hub.snapshot_download
    downloads = []

    def fake_snapshot(repo_id, cache_dir, local_files_only=False, **kwargs):
        if local_files_only:
            return real_snapshot(repo_id=repo_id, cache_dir=cache_dir, local_files_only=True)
        downloads.append(repo_id)
        repo = Path(cache_dir) / f"models--{repo_id.replace('/', '--')}"
        snap = repo / "snapshots" / ("0" * 40)
        for sub in ("transformer", "vae", "tokenizer", "text_encoder"):
            (snap / sub).mkdir(parents=True)
        (snap / "transformer" / "config.json").write_text("{}")
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text("0" * 40)
        return str(snap)

    def fake_file(repo_id, filename, local_dir, **kwargs):
        downloads.append(f"{repo_id}::{filename}")
        (Path(local_dir) / filename).parent.mkdir(parents=True, exist_ok=True)
        (Path(local_dir) / filename).write_bytes(b"ckpt")
        return str(Path(local_dir) / filename)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_file)
    (tmp_path / "configs" / "model").mkdir(parents=True)
    checkpoint = tmp_path / "w" / "self_forcing" / "checkpoints" / "self_forcing_dmd.pt"
    cfg = {"kind": "diffusers", "name": "sf", "transformer_class": "WanTransformer3DModel", "path": "Org/Model",
           "cache_dir": str(tmp_path / "hub"), "transformer_checkpoint": str(checkpoint), "height": 16, "width": 16}
    import yaml

    (tmp_path / "configs" / "model" / "sf.yaml").write_text(yaml.safe_dump({"model": cfg}))  # a preset's model node
    (tmp_path / "configs" / "eval").mkdir()
    eval_default = (ROOT / "configs" / "eval" / "default.yaml").read_text()
    (tmp_path / "configs" / "eval" / "default.yaml").write_text(eval_default)
    monkeypatch.setattr(fw, "CONFIG_DIR", tmp_path / "configs")
    assert check_model("sf", cfg).ready is False
    assert fw.main(["--only", "models"]) == 0
    assert downloads == ["Org/Model", "gdhe17/Self-Forcing::checkpoints/self_forcing_dmd.pt"]
    assert checkpoint.read_bytes() == b"ckpt"
    assert (resolve_local_dir("Org/Model", tmp_path / "hub") / "transformer" / "config.json").is_file()
    assert check_model("sf", cfg).ready


def test_makefile_lets_only_fetch_weights_reach_the_network(tmp_path):
    """The Makefile exports HF_HUB_OFFLINE=1 for every target; fetch-weights must run without it."""
    fake = tmp_path / "py"
    fake.write_text('#!/bin/sh\necho "offline=${HF_HUB_OFFLINE-unset} $*"\n')
    fake.chmod(0o755)
    out = subprocess.run(["make", "-s", "-C", str(ROOT), "-o", ".venv/.setup-stamp", f"PY={fake}",
                          "fetch-weights", "check-weights"], capture_output=True, text=True, check=True).stdout
    assert "offline=unset scripts/fetch_weights.py" in out
    assert "offline=1 -m jensenkv.doctor" in out


def test_every_evaluator_file_fetched_is_recorded_and_then_accepted(fw, caches, monkeypatch, capsys):
    """The manifest beside the downloads records each file's SHA256; files copied in by hand are accepted only
    after --record-present."""
    from jensenkv.eval.checksums import MANIFEST_NAME
    from jensenkv.eval.vbench import dimension_untrusted_reason

    monkeypatch.setattr(torch.hub, "download_url_to_file", _fake_download([]))
    assert fw.main(["--only", "vbench", "--vbench-dims", "subject_consistency"]) == 0
    manifest = json.loads((caches / "vb" / MANIFEST_NAME).read_text())["files"]
    dino_code = "dino_model/facebookresearch_dino_main/vision_transformer.py"  # the repo's code, imported by hub
    assert sorted(manifest) == sorted([*DIMENSION_FILES["subject_consistency"], dino_code])
    hub = json.loads((caches / "torch" / "hub" / "checkpoints" / MANIFEST_NAME).read_text())["files"]
    assert hub["dino_vitbase16_pretrain.pth"]["source"] == fw.DINO_URL
    assert dimension_untrusted_reason("subject_consistency") is None
    (caches / "vb" / dino_code).write_text("import os  # changed after the download\n")
    assert dimension_untrusted_reason("subject_consistency").startswith(f"{caches / 'vb' / dino_code} refused")
    raft = caches / "vb" / DIMENSION_FILES["dynamic_degree"][0]
    raft.parent.mkdir(parents=True)
    raft.write_bytes(b"copied by hand")
    assert "does not record it" in dimension_untrusted_reason("dynamic_degree")
    assert fw.main(["--only", "vbench", "--vbench-dims", "dynamic_degree"]) == 0
    assert "not recorded in the manifest: runs refuse it" in capsys.readouterr().out
    assert dimension_untrusted_reason("dynamic_degree") is not None  # never recorded without being asked
    assert fw.main(["--only", "vbench", "--vbench-dims", "dynamic_degree", "--record-present"]) == 0
    assert dimension_untrusted_reason("dynamic_degree") is None
