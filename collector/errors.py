"""The collector's typed errors: one hierarchy, each error carrying its HTTP status, the reason
label it is counted under (`mfuscope_reports_rejected_total{reason}`) and the field it names."""

from __future__ import annotations

from mfuscope.core.errors import MfuscopeError

__all__ = [
    "BadRequest",
    "IngestError",
    "PayloadTooLarge",
    "RateLimited",
    "Unauthorized",
    "UnsupportedVersion",
]


class IngestError(MfuscopeError):
    """A refused request. `status` is the HTTP status, `reason` a short label, `field` the part of
    the request that was wrong (a schema path such as ``reports[0].wall_s``, or ``body``)."""

    status = 400
    reason = "invalid"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def to_json(self) -> dict[str, str]:
        return {"error": self.message, "field": self.field}


class BadRequest(IngestError):
    """400: the body is not a valid batch (not JSON, bad gzip, missing/mistyped/out-of-range
    fields, components that do not sum to the step)."""


class UnsupportedVersion(BadRequest):
    """400: a schema name or major version this collector does not speak."""

    reason = "version"


class Unauthorized(IngestError):
    """401: the bearer token is missing or wrong."""

    status = 401
    reason = "unauthorized"


class PayloadTooLarge(IngestError):
    """413: the body (or its gzip-decoded form) is over the limit."""

    status = 413
    reason = "too_large"


class RateLimited(IngestError):
    """429: this client is over its request rate; retry after `retry_after_s` seconds."""

    status = 429
    reason = "rate_limited"

    def __init__(self, field: str, message: str, retry_after_s: float) -> None:
        super().__init__(field, message)
        self.retry_after_s = retry_after_s
