"""Settings from arguments and the environment, resolved one way for the agent and the collector.

Precedence, as OpenTelemetry's SDK does it, with one more level for the framework integrations:

1. an explicit argument (not None) from the user;
2. the environment variable ``MFUSCOPE_<NAME>`` (the setting's name upper-cased);
3. a value an integration derives (e.g. FLOPs per step from the framework's own count, a job
   name from the run's name): a better default, never a reason to ignore what the user set;
4. the caller's default.

The caller passes the environment in, so nothing here reads it.

Environment text converts to the setting's annotated type: ``1/true/yes/on`` and
``0/false/no/off`` for booleans, numbers for int and float, and an empty value means "not set"
(None) for an optional setting, and ``key=value,key=value`` for a mapping (e.g. the axis names of
process groups, ``MFUSCOPE_AXIS_OVERRIDES=TENSOR_MODEL_PARALLEL_GROUP=tp,3=dp``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

__all__ = [
    "DERIVED",
    "ENV_PREFIX",
    "Setting",
    "env_name",
    "parse_bool",
    "parse_mapping",
    "parse_quantity",
    "parse_setting_text",
    "pick_settings",
]

ENV_PREFIX = "MFUSCOPE_"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


DERIVED = "derived"


class Setting(msgspec.Struct, frozen=True):
    """A value as given and where it came from: ``argument``, the environment variable's name
    (then `value` is the variable's text) or ``derived`` (an integration's value)."""

    value: object
    source: str

    @property
    def from_env(self) -> bool:
        return self.source.startswith(ENV_PREFIX)


# SI suffixes of the command lines' quantities (B: billions, as in "70B" parameters).
_QUANTITY_SUFFIXES = {"k": 1e3, "m": 1e6, "g": 1e9, "b": 1e9, "t": 1e12, "p": 1e15}


def parse_quantity(text: str) -> float:
    """A number, optionally with a k/M/G(B)/T/P suffix: ``70B`` = 7e10, ``2.5T`` = 2.5e12,
    ``3.1e14`` as written. Raises ValueError naming the text when it is not one."""
    raw = text.strip()
    scale = _QUANTITY_SUFFIXES.get(raw[-1:].lower(), 1.0) if raw[-1:].isalpha() else 1.0
    try:
        return float(raw[:-1] if scale != 1.0 else raw) * scale
    except ValueError:
        raise ValueError(f"not a number: {text!r} (e.g. 3.1e14, 2.5T, 70B)") from None


def env_name(setting: str) -> str:
    """The environment variable of `setting`: ``MFUSCOPE_<SETTING>``."""
    return ENV_PREFIX + setting.upper()


def pick_settings(
    names: Iterable[str],
    arguments: Mapping[str, object],
    env: Mapping[str, str],
    derived: Mapping[str, object] | None = None,
) -> dict[str, Setting]:
    """For each of `names`: the argument when given (not None), else ``MFUSCOPE_<NAME>`` from
    `env`, else the `derived` value (not None); names with none are left out (the caller's
    default applies)."""
    picked: dict[str, Setting] = {}
    for name in names:
        argument = arguments.get(name)
        fallback = (derived or {}).get(name)
        if argument is not None:
            picked[name] = Setting(argument, "argument")
        elif env_name(name) in env:
            picked[name] = Setting(env[env_name(name)], env_name(name))
        elif fallback is not None:
            picked[name] = Setting(fallback, DERIVED)
    return picked


def parse_bool(text: str) -> bool:
    """``1/true/yes/on`` -> True, ``0/false/no/off`` or empty -> False; ValueError otherwise."""
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"expected a boolean (1/0, true/false), got {text!r}")


def parse_mapping(text: str) -> dict[str, str]:
    """``key=value,key=value`` -> a dict (spaces around items ignored); ValueError for an item
    without ``=``, with an empty key or value, or a key given twice."""
    mapping: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise ValueError(f"expected key=value items separated by commas, got {item.strip()!r}")
        if key in mapping:
            raise ValueError(f"{key!r} is given twice")
        mapping[key] = value
    return mapping


def parse_setting_text(text: str, annotation: str) -> object:
    """`text` converted to the type `annotation` names (a dataclass field's annotation as written,
    e.g. ``"float | None"``). Raises ValueError for text that is not of that type."""
    optional = "None" in annotation
    if optional and text.strip() == "":
        return None
    if annotation.startswith("bool"):
        return parse_bool(text)
    if annotation.startswith("int"):
        return int(text)
    if annotation.startswith("float"):
        return float(text)
    if annotation.startswith("Mapping"):
        return parse_mapping(text)
    return text
