"""The report schema: round trip, version rules, and typed errors naming the bad field."""

from __future__ import annotations

import json
from pathlib import Path
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


def test_incarnation_is_optional_and_round_trips() -> None:
    # A 1.0 batch has none: it belongs to the one legacy incarnation "".
    assert s.parse_batch(_batch()).incarnation == ""
    batch = s.parse_batch(_batch(version="1.1", incarnation="5f0c9a1e2b7d4c38"))
    assert batch.incarnation == "5f0c9a1e2b7d4c38"
    assert s.batch_from_json(s.batch_to_json(batch)) == batch
    assert s.batch_to_dict(batch)["version"] == s.SCHEMA_VERSION == "1.3"


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
        ({"incarnation": 7}, "incarnation"),
        ({"incarnation": "x" * 257}, "incarnation"),
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


def _with_classes(classes: Any) -> dict[str, Any]:
    body = _batch(version="1.1")
    body["reports"][0]["compute_classes"] = classes
    return body


def test_compute_classes_round_trip_and_default_to_none() -> None:
    shares = [
        {"kernel_class": "gemm", "seconds": 0.5},
        {"kernel_class": "elementwise_norm_reduce", "seconds": 0.25},
    ]
    batch = s.parse_batch(_with_classes(shares))
    assert batch.reports[0].compute_classes == (
        s.ClassShare("gemm", 0.5),
        s.ClassShare("elementwise_norm_reduce", 0.25),
    )
    assert s.batch_from_json(s.batch_to_json(batch)) == batch
    assert s.parse_batch(_batch()).reports[0].compute_classes == ()  # a 1.0 batch


@pytest.mark.parametrize(
    ("classes", "field"),
    [
        ([{"kernel_class": "conv", "seconds": 0.1}], "compute_classes[0].kernel_class"),
        ([{"kernel_class": "gemm", "seconds": -0.1}], "compute_classes[0].seconds"),
        (
            [{"kernel_class": "gemm", "seconds": 0.1}, {"kernel_class": "gemm", "seconds": 0.1}],
            "compute_classes",
        ),
        (
            [{"kernel_class": "gemm", "seconds": 0.8}, {"kernel_class": "other", "seconds": 0.8}],
            "compute_classes",
        ),
    ],
)
def test_bad_compute_classes_name_the_field(classes: Any, field: str) -> None:
    with pytest.raises(s.SchemaError) as info:
        s.parse_batch(_with_classes(classes))
    assert info.value.field == f"reports[0].{field}"


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


@pytest.mark.parametrize("given", [{"group_size": None}, {}])
def test_an_unknown_group_size_is_null(given: dict[str, object]) -> None:
    body = _batch()
    collective = body["reports"][0]["collectives"][0]
    del collective["group_size"]
    collective.update(given)
    batch = s.parse_batch(body)
    assert batch.reports[0].collectives[0].group_size is None
    assert s.batch_to_dict(batch)["reports"][0]["collectives"][0]["group_size"] is None
    assert s.parse_batch(json.loads(s.batch_to_json(batch))) == batch


_WIRE = Path(__file__).parents[2] / "data" / "wire"


# Fields added after a recorded version, with the default that version's bodies decode to.
_ADDED_SINCE = {"1.3": {"run_key": ""}}


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2", "1.3"])
def test_recorded_bodies_of_every_version_decode_as_they_did(version: str) -> None:
    # Bodies written by each version's own encoder, and what the parser of that version read
    # from them (tests/data/README.md); later fields decode to their defaults, and the dict
    # says today's version.
    body = (_WIRE / f"batch-{version}.json").read_bytes()
    expected = json.loads((_WIRE / f"batch-{version}.decoded.json").read_text())
    for since, fields in _ADDED_SINCE.items():
        if version < since:
            expected.update(fields)
    expected["version"] = s.SCHEMA_VERSION
    batch = s.decode_batch(body)
    assert json.loads(json.dumps(s.batch_to_dict(batch))) == expected
    assert s.decode_batch(s.encode_batch(batch)) == batch
    assert s.encode_batch(batch).startswith(b'{"schema":"mfuscope.report","version":"1.3",')


def test_the_dict_parser_refuses_a_value_json_cannot_hold() -> None:
    # The dict parser's own step before the body decoder: a value that is not JSON is a
    # `SchemaError` on the batch, not a TypeError from inside the encoder.
    raw = _batch()
    raw["reports"][0]["step"] = {1, 2}
    with pytest.raises(s.SchemaError) as info:
        s.parse_batch(raw)
    assert info.value.field == "batch" and "not a JSON value" in info.value.message


@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        (b'{"schema":"mfuscope.report","version":"2.0","job":7}', "version", "major version 2"),
        (b'{"version":"1.0"}', "schema", "missing"),
        (b'{"schema":"mfuscope.report","version":"1.0","job":"j"}', "rank", "missing"),
        (b"[1]", "batch", "Expected `object`, got `array`"),
        (b'{"schema":"mfuscope.report","version":"1.0",', "body", "not JSON"),
        (b'{"schema":"mfuscope.report","version":"1.0","job":"\xff"}', "body", "not JSON"),
        (b'{"schema":"mfuscope.report","version":"1.0","job":NaN}', "job", "must be finite"),
    ],
)
def test_bodies_msgspec_refuses_name_the_field(body: bytes, field: str, reason: str) -> None:
    with pytest.raises(s.SchemaError) as info:
        s.decode_batch(body)
    assert info.value.field == field
    assert reason in info.value.message
    assert "\n" not in str(info.value)


def test_a_bad_choice_names_the_allowed_values() -> None:
    body = _batch()
    body["reports"][0]["collectives"][0]["op"] = "all_reduce\n"
    with pytest.raises(s.SchemaError) as info:
        s.parse_batch(body)
    assert info.value.field == "reports[0].collectives[0].op"
    assert info.value.message.startswith("not one of all_reduce, all_gather, reduce_scatter")


def test_an_overlap_over_its_total_by_rounding_is_clamped() -> None:
    body = _batch()
    body["reports"][0]["collectives"][0].update(seconds=0.5, overlapped_s=0.5 * (1 + 1e-9))
    body["reports"][0]["overlapped_comm_s"] = 1.0 + 1e-10
    report = s.parse_batch(body).reports[0]
    assert report.collectives[0].overlapped_s == 0.5
    assert report.overlapped_comm_s == 1.0
