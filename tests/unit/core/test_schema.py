"""The report schema: round trip, version rules, and typed errors naming the bad field."""

from __future__ import annotations

import json
from typing import Any

import pytest
from mfuscope.core import schema as s


def _batch(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "schema": "mfuscope.report",
        "version": "1.0",
        "job": "j",
        "rank": 1,
        "world_size": 2,
        "host": "h",
        "device": "cpu",
        "peak_flops": 1e11,
        "peak_source": "measured",
        "sent_unix_ns": 1,
        "reports": [
            {
                "step": 3,
                "start_unix_ns": 5,
                "wall_s": 1.0,
                "model_flops": 10.0,
                "recompute_flops": 2.0,
                "components": [
                    {"component": "compute", "seconds": 0.75},
                    {
                        "component": "exposed_comm",
                        "axis": "dp",
                        "tier": "intra_node",
                        "seconds": 0.25,
                    },
                ],
                "collectives": [
                    {
                        "op": "all_reduce",
                        "axis": "dp",
                        "tier": "intra_node",
                        "group_size": 2,
                        "bytes": 1024,
                        "count": 2,
                        "seconds": 0.5,
                        "overlapped_s": 0.25,
                    }
                ],
            }
        ],
    }
    body.update(overrides)
    return body


def test_round_trip_preserves_every_field() -> None:
    batch = s.parse_batch(_batch())
    again = s.batch_from_json(s.batch_to_json(batch))
    assert again == batch
    assert batch.reports[0].hardware_flops == 12.0


def test_newer_minor_accepted_and_unknown_fields_ignored() -> None:
    assert s.parse_batch(_batch(version="1.7", future_field=1)).job == "j"


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"version": "2.0"}, "version"),
        ({"schema": "other"}, "schema"),
        ({"rank": 2}, "rank"),
        ({"job": ""}, "job"),
        ({"peak_flops": None}, "peak_flops"),
        ({"rank": True}, "rank"),
    ],
)
def test_bad_batch_fields_are_named(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(s.SchemaError) as info:
        s.parse_batch(_batch(**overrides))
    assert info.value.field == field


@pytest.mark.parametrize(
    ("key", "value", "field"),
    [
        ("wall_s", -1.0, "reports[0].wall_s"),
        ("wall_s", float("nan"), "reports[0].wall_s"),
        ("model_flops", 1e30, "reports[0].model_flops"),
        ("components", [{"component": "compute", "seconds": 0.5}], "reports[0].components"),
        (
            "components",
            [{"component": "nap", "seconds": 1.0}],
            "reports[0].components[0].component",
        ),
    ],
)
def test_bad_report_fields_are_named(key: str, value: Any, field: str) -> None:
    body = _batch()
    body["reports"][0][key] = value
    with pytest.raises(s.SchemaError) as info:
        s.parse_batch(json.loads(json.dumps(body, allow_nan=True)))
    assert info.value.field == field


def test_not_json_is_a_schema_error() -> None:
    with pytest.raises(s.SchemaError) as info:
        s.batch_from_json(b"\x1f\x8b garbage")
    assert info.value.field == "body"


def test_integer_too_large_for_a_float_is_a_schema_error() -> None:
    with pytest.raises(s.SchemaError) as info:
        s.parse_batch(_batch(peak_flops=10**400))
    assert info.value.field == "peak_flops"


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"job": "caf\udce9-run"}, "job"),  # a Latin-1 byte decoded with surrogateescape
        ({"host": "\ud800"}, "host"),
        ({"device": "x" * 257}, "device"),
        ({"version": "1.\u00b2"}, "version"),
        ({"version": "\u0661.0"}, "version"),  # an Arabic-Indic digit
        ({"version": "1.0 "}, "version"),
        ({"version": "1"}, "version"),
    ],
)
def test_strings_must_be_utf8_labels_and_versions_ascii_digits(
    overrides: dict[str, Any], field: str
) -> None:
    with pytest.raises(s.SchemaError) as info:
        s.parse_batch(_batch(**overrides))
    assert info.value.field == field


def test_non_ascii_utf8_names_are_accepted() -> None:
    assert s.parse_batch(_batch(job="café-run-日本")).job == "café-run-日本"


@pytest.mark.parametrize(
    ("key", "value", "field"),
    [
        ("wall_s", 1e-300, "reports[0].wall_s"),
        ("wall_s", 0.0, "reports[0].wall_s"),
        ("overlapped_comm_s", 86_400.0, "reports[0].overlapped_comm_s"),
        ("overlapped_comm_s", -0.5, "reports[0].overlapped_comm_s"),
        ("start_unix_ns", -1, "reports[0].start_unix_ns"),
    ],
)
def test_physically_impossible_times_are_refused(key: str, value: Any, field: str) -> None:
    body = _batch()
    body["reports"][0][key] = value
    if key == "wall_s":
        body["reports"][0]["components"] = []
    with pytest.raises(s.SchemaError) as info:
        s.parse_batch(body)
    assert info.value.field == field


def test_a_collective_shorter_than_a_nanosecond_is_refused() -> None:
    body = _batch()
    body["reports"][0]["collectives"][0].update(seconds=1e-300, overlapped_s=0.0)
    with pytest.raises(s.SchemaError) as info:
        s.parse_batch(body)
    assert info.value.field == "reports[0].collectives[0].seconds"
