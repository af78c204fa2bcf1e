"""The readiness report and the run pre-flight check, on fake caches and weight files in tmp dirs."""
from __future__ import annotations

import pytest

from jensenkv import doctor
from jensenkv.eval.vbench import DIMENSION_FILES


@pytest.fixture
def caches(tmp_path, monkeypatch):
    import vbench.utils

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setattr(vbench.utils, "CACHE_DIR", str(tmp_path / "vb"))
    return tmp_path


def _touch(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


def test_lpips_is_missing_with_the_exact_path_until_the_file_is_there(caches):
    check = doctor.check_metric("lpips", "squeeze")
    path = caches / "torch" / "hub" / "checkpoints" / "squeezenet1_1-b8a52dc0.pth"
    assert not check.ready and check.files == [(path, False)]
    assert ("lpips", "lpips", None) in check.modules
    _touch(path)  # present, but not the file its name's hash (b8a52dc0) says: refused as the run would refuse it
    check = doctor.check_metric("lpips", "squeeze")
    assert check.files == [(path, True)] and not check.ready
    assert check.notes == [f"{path} refused before loading (the loader unpickles it, which runs code): its SHA256 "
                           "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855 does not start with "
                           "b8a52dc0, the hash in its name, and no jensenkv-weights-manifest.json records these bytes "
                           "as downloaded from its publisher (`make fetch-weights`)"]


def test_subject_consistency_lists_vbench_and_torch_hub_paths(caches):
    check = doctor.check_vbench_dimension("subject_consistency")
    expected = [caches / "vb" / rel for rel in DIMENSION_FILES["subject_consistency"]]
    expected.append(caches / "torch" / "hub" / "checkpoints" / "dino_vitbase16_pretrain.pth")
    assert [p for p, _ in check.files] == expected and not check.ready
    assert "make fetch-weights" in check.fix()
    for path in expected:
        _touch(path)
    problem = doctor.check_vbench_dimension("subject_consistency").problem()  # present but recorded nowhere
    assert f"{expected[0]} refused before loading" in problem and "no jensenkv-weights-manifest.json" in problem
    from jensenkv.eval.checksums import record

    for path in expected:  # recorded, as `make fetch-weights` leaves them
        record(caches, path, "test")
    assert doctor.check_vbench_dimension("subject_consistency").ready  # cv2 and the scorer import here


def test_a_module_that_does_not_import_is_reported_with_its_pip_name(caches, monkeypatch):
    from jensenkv.eval import vbench as vb

    monkeypatch.setitem(vb.DIMENSION_PACKAGES, "temporal_flickering", (("jensenkv_no_such_module", "some-pkg"),))
    check = doctor.check_vbench_dimension("temporal_flickering")
    assert not check.ready and "make setup" in check.fix()
    report = doctor.format_report([check])
    assert "FAILS" in report and "jensenkv_no_such_module" in report and "some-pkg" in report


def test_weight_free_dimension_and_plain_metrics_are_ready(caches):
    assert doctor.check_vbench_dimension("temporal_flickering").ready
    assert all(doctor.check_metric(m).ready for m in ("psnr", "ssim", "attention"))
    assert not doctor.check_vbench_dimension("object_class").ready  # refused in custom_input mode


def test_tiny_model_files_are_checked(tmp_path):
    assert doctor.check_model("tiny", {"kind": "tiny"}).ready  # the packaged weights
    check = doctor.check_model("tiny", {"kind": "tiny", "weights_dir": str(tmp_path)})
    assert [p for p, ok in check.files if not ok] == [tmp_path / "model.safetensors", tmp_path / "config.json"]


def test_hub_model_absent_from_the_cache_names_the_cache_folder(tmp_path):
    cfg = {"kind": "diffusers", "path": "Skywork/SkyReels-V2-DF-1.3B-540P-Diffusers", "cache_dir": str(tmp_path)}
    check = doctor.check_model("skyreels", cfg)
    assert check.files == [(tmp_path / "models--Skywork--SkyReels-V2-DF-1.3B-540P-Diffusers", False)]


def test_require_ready_stops_with_one_line_saying_what_to_do(caches):
    with pytest.raises(doctor.NotReadyError) as err:
        doctor.require_ready(["psnr", "lpips", "vbench"], ["temporal_flickering", "background_consistency"], "alex",
                             model={"kind": "tiny", "name": "tiny"})
    message = str(err.value)
    assert "\n" not in message
    assert str(caches / "torch" / "hub" / "checkpoints" / "alexnet-owt-7be5be79.pth") in message
    assert str(caches / "vb" / "clip_model" / "ViT-B-32.pt") in message
    assert "make fetch-weights" in message and "temporal_flickering" not in message
    assert isinstance(err.value, FileNotFoundError)  # the run CLI's one-line error path catches it
    doctor.require_ready(["psnr", "ssim", "attention", "vbench"], ["temporal_flickering"],
                         model={"kind": "tiny", "name": "tiny"})  # ready: returns


def test_report_command_lists_every_check_and_exits_1_on_missing_only_with_strict(caches, capsys):
    assert doctor.main(["--models", "tiny", "--metrics", "psnr", "vbench", "--vbench-dims", "temporal_flickering"]) == 0
    out = capsys.readouterr().out
    assert "[ready] model tiny" in out and "[ready] vbench temporal_flickering" in out and "4 of 4 ready" in out
    assert doctor.main(["--models", "tiny", "--metrics", "lpips"]) == 0  # a report: missing is not a failure
    assert capsys.readouterr().out.splitlines()[-1].startswith("1 missing: ")
    assert doctor.main(["--models", "tiny", "--metrics", "lpips", "--strict"]) == 1
    out = capsys.readouterr().out
    assert "[MISSING] metric lpips" in out
    assert f"missing  {caches / 'torch' / 'hub' / 'checkpoints' / 'alexnet-owt-7be5be79.pth'}" in out
