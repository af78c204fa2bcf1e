"""The backend registry: names map to kernels with one contract, unknown names fail clearly."""
from __future__ import annotations

import pytest

from attention_testkit import make_case, relative_error
from jensenkv.attention import ATTENTION_BACKENDS, get_backend, reference_attention


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("name", ["cached", "reference", "flex"])
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
