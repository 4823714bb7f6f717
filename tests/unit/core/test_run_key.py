"""The run key: one fingerprint per workload, another for any change of what fixes its MFU."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mfuscope.core.run_key import RUN_KEY_MAX_CHARS, check_run_key, fingerprint

BASE = {
    "model_flops_per_step": 3.1e14,
    "world_size": 16,
    "layout": (("dp", 2), ("tp", 8)),
    "device": "NVIDIA H100 80GB HBM3",
    "dtype": "bf16",
}


def test_the_same_workload_has_one_key() -> None:
    key = fingerprint(**BASE)  # type: ignore[arg-type]
    assert key.startswith("fp-") and len(key) == 19
    # Layout order and repeated groups (several ranks' views of one axis) do not matter, nor
    # does a recount a few FLOPs off, nor the dtype's case.
    same = dict(BASE, layout=(("tp", 8), ("dp", 2), ("tp", 8)), dtype="BF16")
    assert fingerprint(**same) == key  # type: ignore[arg-type]
    assert fingerprint(**dict(BASE, model_flops_per_step=3.1e14 + 1e9)) == key  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "change",
    [
        {"model_flops_per_step": 3.2e14},
        {"world_size": 32},
        {"layout": (("dp", 4), ("tp", 4))},
        {"layout": (("dp", 2), ("tp", 8), ("pp", 1))},
        {"device": "NVIDIA A100-SXM4-80GB"},
        {"dtype": "fp8"},
    ],
    ids=lambda c: next(iter(c)),
)
def test_any_change_of_what_fixes_mfu_is_another_key(change: dict[str, object]) -> None:
    assert fingerprint(**dict(BASE, **change)) != fingerprint(**BASE)  # type: ignore[arg-type]


@given(st.floats(min_value=0, max_value=1e25), st.integers(min_value=1, max_value=1 << 20))
def test_fingerprints_are_short_label_values(flops: float, world: int) -> None:
    key = fingerprint(flops, world, (), "cpu", "fp32")
    assert check_run_key(key) == key


@pytest.mark.parametrize(
    "bad",
    [{"model_flops_per_step": float("nan")}, {"model_flops_per_step": -1.0}, {"world_size": 0}],
)
def test_impossible_facts_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        fingerprint(**dict(BASE, **bad))  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["", "x" * (RUN_KEY_MAX_CHARS + 1), "a\nb"])
def test_a_users_key_must_be_a_readable_label(bad: str) -> None:
    with pytest.raises(ValueError):
        check_run_key(bad)
    assert check_run_key("llama-70b nightly") == "llama-70b nightly"
