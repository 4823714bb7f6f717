"""The step buckets are named once, in core/vocabulary.py, and what lists them follows: the
waterfall's slices, their titles, the fields of the core waterfall's structs."""

from __future__ import annotations

import msgspec
import pytest
from mfuscope.core.mfu import MfuWaterfall, StepBuckets, mfu_waterfall
from mfuscope.core.vocabulary import (
    BUBBLE_COMPONENTS,
    COMPONENTS,
    ELEMENTWISE_SLICE,
    KERNEL_INEFFICIENCY_SLICE,
    SLICE_TITLES,
    WAITING_COMPONENTS,
    WATERFALL_SLICES,
)


def test_every_bucket_but_compute_is_a_waterfall_slice_and_has_a_title() -> None:
    buckets = [c for c in COMPONENTS if c != "compute"]
    assert sorted(WATERFALL_SLICES) == sorted(
        [*buckets, ELEMENTWISE_SLICE, KERNEL_INEFFICIENCY_SLICE]
    )
    assert WATERFALL_SLICES[-2:] == (ELEMENTWISE_SLICE, KERNEL_INEFFICIENCY_SLICE)
    assert set(SLICE_TITLES) == set(COMPONENTS) | set(WATERFALL_SLICES)
    assert set(BUBBLE_COMPONENTS) | WAITING_COMPONENTS <= set(COMPONENTS)


def test_the_core_waterfall_has_a_field_per_bucket_and_slice() -> None:
    assert [f.name for f in msgspec.structs.fields(StepBuckets)] == [
        *(f"{c}_s" for c in COMPONENTS),
        "elementwise_s",
    ]
    fields = {f.name for f in msgspec.structs.fields(MfuWaterfall)}
    assert set(WATERFALL_SLICES) <= fields


def test_buckets_from_a_mapping_fill_the_missing_ones_with_zero() -> None:
    buckets = StepBuckets.of({"compute": 3.0, "bubble_idle": 1.0}, elementwise_s=0.5)
    assert buckets.window_s == 4.0
    assert [buckets.seconds(c) for c in COMPONENTS].count(0.0) == len(COMPONENTS) - 2
    w = mfu_waterfall(1.0, 1.0, buckets)
    assert list(w.slices()) == list(WATERFALL_SLICES)
    assert w.mfu + sum(w.slices().values()) == pytest.approx(1.0)
