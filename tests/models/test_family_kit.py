"""Every model family passes the same conformance kit (tests/models/family_testkit.py): it generates, a batch is
each video alone, the caches hold no slack, probes split per video, and the whole CLI path (run, record, the
store's damage check, report.table1 and report.claims, a no-op rerun) works on its tiny preset. The controls
plant defects the kit must catch: a text column in attention.csv, a batch that swaps its videos, caches left
unreserved."""
from __future__ import annotations

from pathlib import Path

import pytest

import family_testkit as kit
from family_testkit import CASES, FamilyCase


def _case_params(slow=lambda case: False):
    return [pytest.param(case, id=name, marks=[pytest.mark.slow] if slow(case) else []) for name, case in CASES.items()]


def _variant_params(variants, slow_variants=lambda case: frozenset(), defect=lambda case: None):
    """(case, variant) params; a variant in ``slow_variants`` is slow, and a case with a known ``defect`` is an
    expected failure (strict: fixing it turns the test red until the defect is removed from the case)."""
    def marks(case, variant):
        known = defect(case)
        if known:
            return [pytest.mark.slow, pytest.mark.xfail(reason=known, raises=AssertionError, strict=True)]
        return [pytest.mark.slow] if variant in slow_variants(case) else []

    return [pytest.param(case, variant, id=f"{name}-{variant}", marks=marks(case, variant))
            for name, case in CASES.items() for variant in variants(case)]


@pytest.fixture(scope="session")
def kit_folder(tmp_path_factory) -> Path:
    """Where the cases write the files their presets read (the diffusers folders), once per session."""
    return tmp_path_factory.mktemp("family_kit_files")


@pytest.fixture(scope="session")
def cli_stores(tmp_path_factory):
    """One CLI run per case and session, made on first use: case -> (root, CliRun, run id)."""
    made: dict[str, tuple[Path, kit.CliRun, str]] = {}

    def store(case: FamilyCase) -> tuple[Path, kit.CliRun, str]:
        if case.name not in made:
            root = tmp_path_factory.mktemp(f"kit_cli_{case.name}")
            run = kit.run_family_cli(case, root)
            made[case.name] = (root, run, kit.check_cli_run(run))
        return made[case.name]

    return store


# --- the adapter checks --------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", _case_params())
def test_the_family_generates(case, kit_folder):
    kit.check_generates(kit.adapter_of(kit.spec_of(case, kit_folder, *kit.INT2)))


@pytest.mark.parametrize(("case", "variant"), _variant_params(lambda case: case.batch_variants,
                                                              lambda case: case.slow_batch_variants,
                                                              lambda case: case.batch_defect))
def test_a_batch_makes_each_video_as_alone(case, variant, kit_folder):
    spec = kit.spec_of(case, kit_folder, *case.batch_variants[variant])
    assert kit.family_batches(spec), f"{case.name} lists batch variants but its family does not batch"
    kit.check_batch_equals_alone(kit.adapter_of(spec, kit.PROBES))


def test_every_family_that_batches_has_a_batch_variant():
    for case in CASES.values():
        if case.files is None:  # a case reading files is checked by the batch test itself
            assert bool(case.batch_variants) == kit.family_batches(kit.spec_of(case, None)), case.name


@pytest.mark.parametrize(("case", "variant"), _variant_params(lambda case: case.reserve_variants))
def test_after_a_video_every_cache_holds_exactly_what_it_stores(case, variant, kit_folder):
    spec = kit.spec_of(case, kit_folder, *case.reserve_variants[variant])
    kit.check_reserve_leaves_no_slack(kit.generated_caches(kit.adapter_of(spec, probes=None),
                                                           spec.generation.use_cfg))


@pytest.mark.parametrize("case", _case_params(slow=lambda case: case.slow_probe_split))
def test_probes_split_per_video(case, kit_folder):
    spec = kit.spec_of(case, kit_folder, *kit.INT2)
    kit.check_probes_split_per_video(case, kit.adapter_of(spec), kit.family_batches(spec))


# --- the CLI path --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", _case_params(slow=lambda case: case.slow_cli))
def test_the_cli_run_leaves_a_sound_store_the_reports_read(case, cli_stores):
    root, run, run_id = cli_stores(case)
    kit.check_store(case, run.results, run_id)
    kit.check_reports(run.results, root)


@pytest.mark.parametrize("case", _case_params(slow=lambda case: case.slow_cli))
def test_the_cli_rerun_is_a_no_op(case, cli_stores):
    root, run, _ = cli_stores(case)
    kit.check_rerun_is_noop(case, root)


# --- the kit fails on planted defects ------------------------------------------------------------------------
class _Wrapped:
    """An adapter that passes everything to ``inner`` but what the planted defect changes."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _SwapsVideos(_Wrapped):
    """Defect: a batch's prompts reach the model rotated by one, so each video gets another video's text."""

    def set_prompts(self, prompts, negative_prompt=None):
        prompts = list(prompts)
        return self._inner.set_prompts(prompts[1:] + prompts[:1], negative_prompt)


class _TextProbeColumn(_Wrapped):
    """Defect: every probe record carries a text value (a ``note``) where the probe table holds numbers."""

    def probes(self):
        records = self._inner.probes()
        return None if records is None else [{**r, "note": f"p_s {r['p_s']:.3f}"} for r in records]


def _plant(monkeypatch, kind: str, wrapper: type) -> None:
    """The family ``kind`` of the registry replaced by one whose adapters are wrapped in ``wrapper``."""
    from jensenkv.models import registry

    real = registry.FAMILIES[kind]

    class Planted(type(real)):
        def build_adapter(self, *args, **kwargs):
            return wrapper(real.build_adapter(*args, **kwargs))

    monkeypatch.setitem(registry.FAMILIES, kind, Planted())


def test_control_a_batch_that_swaps_its_videos_fails_the_kit(monkeypatch):
    case = CASES["magi1_tiny"]
    spec = kit.spec_of(case, None, *kit.INT2)
    kit.check_batch_equals_alone(kit.adapter_of(spec))  # the sound family passes
    _plant(monkeypatch, spec.model.kind, _SwapsVideos)
    with pytest.raises(AssertionError, match="differs from the same video alone"):
        kit.check_batch_equals_alone(kit.adapter_of(spec))


def test_control_a_text_column_in_attention_csv_fails_the_kit(monkeypatch, tmp_path):
    """The planted family's run goes through the CLI; the kit's store check reports the text column. The store's
    own check accepts it (the writer lists the table's text columns in the record: record_check.text_columns),
    so the kit, which knows the family's label columns, is what catches it."""
    case = CASES["tiny"]
    _plant(monkeypatch, "tiny", _TextProbeColumn)
    run = kit.run_family_cli(case, tmp_path)
    run_id = kit.check_cli_run(run)
    with pytest.raises(AssertionError, match=r"holds text in \['branch', 'note'\]"):
        kit.check_store(case, run.results, run_id)


@pytest.mark.parametrize(("case", "variant"), _variant_params(lambda case: list(case.reserve_variants)[:1]))
def test_control_caches_left_unreserved_fail_the_kit(case, variant, kit_folder, monkeypatch):
    """Every reservation made a no-op (the adapters' hook and WorldPlay's per-write sizing): the doubling buffers
    hold slack, and the kit says so."""
    spec = kit.spec_of(case, kit_folder, *case.reserve_variants[variant])
    monkeypatch.setattr(kit._internals().ChunkedKVCache, "reserve", lambda self, tokens, sink_tokens=0: None)
    caches = kit.generated_caches(kit.adapter_of(spec, probes=None), spec.generation.use_cfg)
    with pytest.raises(AssertionError, match="holding other than what they store"):
        kit.check_reserve_leaves_no_slack(caches)
