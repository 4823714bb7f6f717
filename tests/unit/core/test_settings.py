"""Settings precedence (argument > MFUSCOPE_* > an integration's derived value > default) and
environment text conversion."""

from __future__ import annotations

import pytest
from mfuscope.core.settings import Setting, parse_setting_text, pick_settings


def test_argument_beats_environment_beats_default() -> None:
    env = {"MFUSCOPE_A": "env-a", "MFUSCOPE_B": "env-b"}
    picked = pick_settings(["a", "b", "c"], {"a": "arg-a", "b": None}, env)
    assert picked == {"a": Setting("arg-a", "argument"), "b": Setting("env-b", "MFUSCOPE_B")}
    assert picked["b"].from_env and not picked["a"].from_env


def test_a_derived_value_ranks_below_argument_and_environment() -> None:
    env = {"MFUSCOPE_B": "env-b"}
    derived = {"a": "derived-a", "b": "derived-b", "c": "derived-c", "d": None}
    picked = pick_settings(["a", "b", "c", "d"], {"a": "arg-a"}, env, derived)
    assert picked == {
        "a": Setting("arg-a", "argument"),
        "b": Setting("env-b", "MFUSCOPE_B"),
        "c": Setting("derived-c", "derived"),
    }  # "d": nobody set it, the caller's default applies
    assert not picked["c"].from_env


@pytest.mark.parametrize(
    ("text", "annotation", "expected"),
    [
        ("on", "bool", True),
        ("0", "bool", False),
        ("7", "int", 7),
        ("0.5", "float", 0.5),
        ("", "float | None", None),
        ("", "str | None", None),  # an empty optional setting is "not set", for every caller
        ("x", "str | None", "x"),
    ],
)
def test_environment_text_converts_to_the_annotated_type(
    text: str, annotation: str, expected: object
) -> None:
    assert parse_setting_text(text, annotation) == expected


@pytest.mark.parametrize(
    ("text", "annotation"), [("maybe", "bool"), ("1.5", "int"), ("x", "float")]
)
def test_bad_environment_text_raises_value_error(text: str, annotation: str) -> None:
    with pytest.raises(ValueError):
        parse_setting_text(text, annotation)
