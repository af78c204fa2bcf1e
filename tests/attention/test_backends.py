"""The backend registry: names map to kernels with one contract, unknown names fail clearly."""
from __future__ import annotations

import math

import pytest

from attention_testkit import make_case, relative_error
from jensenkv.attention import ATTENTION_BACKENDS, get_backend, reference_attention


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("name", ATTENTION_BACKENDS.names(lambda c: c.device_refusal is None))  # any device
@pytest.mark.parametrize("correction", ["none", "taylor", "exact"])
def test_builtin_backends_share_the_oracle_contract(name, correction):
    case = make_case(4, False, seed=11)
    args = (case.q, case.k_cur, case.v_cur, case.segments)
    out = get_backend(name)(*args, correction=correction, strength=0.7)
    assert relative_error(out, reference_attention(*args, correction=correction, strength=0.7)) <= 1e-5


def test_unknown_backend_names_the_registered_ones():
    with pytest.raises(ValueError, match=r"attention backend='triton_typo' is not allowed: use one of \(.*'cached'"):
        get_backend("triton_typo")


def test_a_registered_backend_is_found_at_once(monkeypatch):
    def kernel(q, k_cur, v_cur, segments, **kwargs):
        return q

    monkeypatch.setitem(ATTENTION_BACKENDS, "mine", kernel)
    assert get_backend("mine") is kernel


def test_triton_on_a_cpu_runs_under_the_interpreter_only(monkeypatch):
    """TRITON_INTERPRET=1 is the supported CPU path of backend=triton (tests, dry runs): the pre-check lets it
    through; without it, a CPU run stops in one line naming attention.backend."""
    pytest.importorskip("triton")
    from jensenkv.attention.backends import check_backend_device

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    check_backend_device("triton", "cpu")
    for off in ("0", ""):
        monkeypatch.setenv("TRITON_INTERPRET", off)
        with pytest.raises(ValueError, match=r"attention\.backend.*needs a CUDA device.*TRITON_INTERPRET=1"):
            check_backend_device("triton", "cpu")


def test_builtin_capabilities_answer_the_side_questions():
    """What was five tables is one registry: each question is a query on the capabilities registered beside the
    kernels, in registration order."""
    from jensenkv.attention.backends import causal_backends, reads_kv_heads, second_order_backends

    assert tuple(ATTENTION_BACKENDS) == ("cached", "reference", "flex", "triton")
    assert second_order_backends() == ("cached", "reference") == causal_backends()
    assert [reads_kv_heads(name) for name in ATTENTION_BACKENDS] == [False, False, False, True]
    assert ATTENTION_BACKENDS.capabilities("triton").storage_refusal is not None
    assert all(ATTENTION_BACKENDS.capabilities(n).storage_refusal is None for n in ("cached", "reference", "flex"))


@pytest.fixture
def registered():
    """register_backend on a scratch registry entry "probe_kernel" that records what reaches the kernel."""
    from jensenkv.attention.registry import Capabilities, register_backend

    seen = []

    def kernel(q, k_cur, v_cur, segments, correction, scale, strength, second_order, causal, **options):
        seen.append(dict(scale=scale, correction=correction, second_order=second_order, causal=causal, **options))
        return reference_attention(q, k_cur, v_cur, segments, correction, scale, strength)

    entry = register_backend("probe_kernel", Capabilities(second_order=False, causal=False))(kernel)
    yield entry, seen
    del ATTENTION_BACKENDS["probe_kernel"]  # not monkeypatch.delitem: its undo would put the entry back


def test_a_registered_kernel_gets_checked_calls_only(registered):
    """The entry point checks the call once against the capabilities (inputs, second order, causal) and hands
    the kernel a resolved float scale and its own options."""
    entry, seen = registered
    case = make_case(4, False, seed=3)
    args = (case.q, case.k_cur, case.v_cur, case.segments)
    assert get_backend("probe_kernel") is entry
    out = entry(*args, correction="taylor", tile=7)
    assert relative_error(out, reference_attention(*args, correction="taylor")) <= 1e-12
    assert seen == [dict(scale=1.0 / math.sqrt(case.q.shape[-1]), correction="taylor", second_order=False, causal=False,
                         tile=7)]
    with pytest.raises(ValueError, match=r"second_order=True is not allowed with backend='probe_kernel'.*"
                                         r"\('cached', 'reference'\)"):
        entry(*args, correction="taylor", second_order=True)
    with pytest.raises(ValueError, match=r"causal=True is not allowed with attention.backend='probe_kernel'"):
        entry(*args, causal=True)
    with pytest.raises(ValueError, match=r"correction='bogus' is not allowed"):
        entry(*args, correction="bogus")
    assert len(seen) == 1  # no refused call reached the kernel


def test_a_stand_in_keeps_the_names_capabilities_and_is_put_back(monkeypatch):
    """Setting a registered name to a plain function (a test's spy) keeps what the name can do; putting the
    entry point back restores the registration."""
    from jensenkv.attention import triton_cached_attention
    from jensenkv.attention.backends import reads_kv_heads

    def spy(q, k_cur, v_cur, segments, **kwargs):
        return triton_cached_attention(q, k_cur, v_cur, segments, **kwargs)

    with monkeypatch.context() as patch:
        patch.setitem(ATTENTION_BACKENDS, "triton", spy)
        assert get_backend("triton") is spy and reads_kv_heads("triton")
    assert get_backend("triton") is triton_cached_attention
    assert ATTENTION_BACKENDS.backend("triton").kernel is not triton_cached_attention  # the kernel behind it


def test_another_name_for_a_registered_entry_keeps_its_capabilities(monkeypatch):
    from jensenkv.attention import triton_cached_attention

    monkeypatch.setitem(ATTENTION_BACKENDS, "fused", triton_cached_attention)
    assert ATTENTION_BACKENDS.capabilities("fused") == ATTENTION_BACKENDS.capabilities("triton")
    assert get_backend("fused") is triton_cached_attention


def test_the_scratch_registration_lives_for_its_test(registered):
    """The fixture's registration lives as long as the test: later tests see the built-ins only."""
    assert "probe_kernel" in ATTENTION_BACKENDS


def test_nothing_is_left_registered_by_the_tests_above():
    assert "probe_kernel" not in ATTENTION_BACKENDS
