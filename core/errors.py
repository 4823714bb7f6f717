"""mfuscope's errors: one hierarchy, each error carrying the data that explains it.

Every error mfuscope raises on purpose derives from `MfuscopeError`. Bad input (a report batch off
the schema, an unreadable trace, a bad option, a question the calculator cannot answer) is an
`InputError`, which is also a `ValueError` so code that guards a conversion with
``except ValueError`` keeps working. The CLI turns an `InputError` into one line on stderr and
exit code 2; the collector maps a `SchemaError` to an HTTP 400 naming the field.
"""

from __future__ import annotations

__all__ = [
    "CalcError",
    "ConfigError",
    "InputError",
    "MfuscopeError",
    "ReportInputError",
    "SchemaError",
    "TraceError",
]


class MfuscopeError(Exception):
    """The base of every error mfuscope raises on purpose."""


class InputError(MfuscopeError, ValueError):
    """Input mfuscope cannot use; the message says what was wrong, in one line."""


class SchemaError(InputError):
    """A report or batch that does not follow the wire schema. `field` names the offending field
    (a schema path such as ``reports[0].wall_s``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class TraceError(InputError):
    """A trace that cannot be read or analysed. `path` names the file (None: not known here)."""

    def __init__(self, path: object, message: str) -> None:
        self.path = None if path is None else str(path)
        self.message = message
        super().__init__(message if self.path is None else f"{self.path}: {message}")


class ConfigError(InputError):
    """A bad agent configuration value. `field` names the option, `source` where it came from
    (``argument``, the environment variable's name, or ``derived``: an integration's value)."""

    def __init__(self, field: str, message: str, source: str = "argument") -> None:
        super().__init__(f"mfuscope agent option {field!r} ({source}): {message}")
        self.field = field
        self.message = message
        self.source = source


class ReportInputError(InputError):
    """Input the report cannot use (no data, several jobs without a choice, ...)."""


class CalcError(InputError):
    """Inputs that do not describe a computable question (reported as exit code 2)."""
