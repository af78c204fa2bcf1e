"""Weight files that loaders unpickle are checked first: published SHA256, the hash in the name, or the manifest
`make fetch-weights` wrote. A changed or unknown file is refused in one line naming it, and the metric is
reported missing with that line; the scorer never sees the file."""
from __future__ import annotations

import hashlib
import sys
import types


from jensenkv.eval.checksums import MANIFEST_NAME, record, untrusted_reason
from jensenkv.eval.vbench import DIMENSION_FILES, dimension_untrusted_reason, evaluate_vbench


def test_the_hash_in_a_torch_hub_name_is_verified(tmp_path):
    content = b"weights that really carry their hash"
    prefix = hashlib.sha256(content).hexdigest()[:8]
    good = tmp_path / f"backbone-{prefix}.pth"
    good.write_bytes(content)
    assert untrusted_reason(good) is None
    musiq = tmp_path / "musiq_spaq_ckpt-358bb6af.pth"  # the name VBench's imaging_quality reads, other bytes
    musiq.write_bytes(b"not the published checkpoint")
    reason = untrusted_reason(musiq)
    assert reason.startswith(f"{musiq} refused before loading") and "does not start with 358bb6af" in reason
    assert "\n" not in reason
    assert "no jensenkv-weights-manifest.json records these bytes" in reason
    record(tmp_path, musiq, "test")  # the bytes `make fetch-weights` downloaded from the publisher vouch for it
    assert untrusted_reason(musiq) is None
    musiq.write_bytes(b"swapped after the download")  # neither the name's hash nor the manifest's
    assert "does not start with 358bb6af" in untrusted_reason(musiq)


def test_clip_files_must_match_openais_published_sha256(tmp_path):
    clip = tmp_path / "clip_model" / "ViT-B-32.pt"  # "-32." is not a hash: the published SHA256 decides
    clip.parent.mkdir()
    clip.write_bytes(b"a look-alike")
    record(tmp_path, clip, "test")
    assert "is not the published 40d36571" in untrusted_reason(clip)


def test_unknown_and_changed_files_are_refused_recorded_ones_accepted(tmp_path):
    aesthetic = tmp_path / "aesthetic_model" / "emb_reader" / "sa_0_4_vit_l_14_linear.pth"
    aesthetic.parent.mkdir(parents=True)
    aesthetic.write_bytes(b"downloaded")
    assert f"no {MANIFEST_NAME} above it records it" in untrusted_reason(aesthetic)
    (tmp_path / MANIFEST_NAME).write_text('{"files": {}}')
    assert "does not record it" in untrusted_reason(aesthetic)
    sha = record(tmp_path, aesthetic, "https://example.invalid/sa.pth")
    assert untrusted_reason(aesthetic) is None
    copy = tmp_path / "copied"  # a copied cache folder keeps its manifest, keyed relative to it
    copy.mkdir()
    (copy / MANIFEST_NAME).write_text((tmp_path / MANIFEST_NAME).read_text())
    (copy / "aesthetic_model" / "emb_reader").mkdir(parents=True)
    (copy / "aesthetic_model" / "emb_reader" / aesthetic.name).write_bytes(b"downloaded")
    assert untrusted_reason(copy / "aesthetic_model" / "emb_reader" / aesthetic.name) is None
    aesthetic.write_bytes(b"swapped afterwards")
    reason = untrusted_reason(aesthetic)
    assert reason.startswith(f"{aesthetic} refused") and f"differs from the {sha} recorded" in reason
    (tmp_path / MANIFEST_NAME).write_text("{not json")
    assert "is not a readable weights manifest" in untrusted_reason(aesthetic)


def _fake_dimension_files(cache, dimension: str) -> None:
    for rel in DIMENSION_FILES[dimension]:
        (cache / rel).parent.mkdir(parents=True, exist_ok=True)
        (cache / rel).write_bytes(b"fake " + rel.encode())


def test_vbench_reports_an_untrusted_dimension_missing_and_never_calls_vbench(tmp_path, monkeypatch):
    """imaging_quality with a stand-in MUSIQ file (its scorer importable): missing with the one line, and VBench,
    whose scorer would unpickle the file, is never called."""
    import jensenkv.eval.vbench as vb

    monkeypatch.setattr(vb, "dimension_missing_reason", lambda dim, cache_dir=None: None)  # files and imports ok
    monkeypatch.setattr(vb, "vbench_cache_dir", lambda: tmp_path / "vb")
    _fake_dimension_files(tmp_path / "vb", "imaging_quality")
    musiq = tmp_path / "vb" / DIMENSION_FILES["imaging_quality"][0]
    assert dimension_untrusted_reason("imaging_quality").startswith(f"{musiq} refused")

    class NoVBench:
        def __init__(self, *args, **kwargs):
            raise AssertionError("VBench was called with an untrusted MUSIQ checkpoint")

    monkeypatch.setitem(sys.modules, "vbench", types.SimpleNamespace(VBench=NoVBench, __file__=str(tmp_path)))
    video = tmp_path / "videos" / "still.mp4"  # never read: the dimension stops before VBench
    result = evaluate_vbench({str(video): "a square"}, ["imaging_quality"], work_dir=tmp_path)
    assert result.scores == {} and result.aggregate is None
    assert result.missing["imaging_quality"].startswith(f"{musiq} refused before loading")
