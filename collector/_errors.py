"""The collector's typed errors: one hierarchy, each error carrying its HTTP status, the reason
label it is counted under (`mfuscope_reports_rejected_total{reason}`) and the field it names."""

from __future__ import annotations

from mfuscope.core.errors import MfuscopeError

__all__ = [
    "LIMIT_REASONS",
    "BadRequest",
    "IngestError",
    "OverLimit",
    "PayloadTooLarge",
    "RateLimited",
    "Unauthorized",
    "UnsupportedMediaType",
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


# The `reason` labels of `OverLimit`, one per cardinality limit.
LIMIT_REASONS: tuple[str, ...] = ("too_many_axes", "too_many_jobs", "too_many_ranks")


class UnsupportedMediaType(IngestError):
    """415: the body is not declared ``application/json`` (a browser's cross-origin form or
    ``text/plain`` POST must not reach the collector)."""

    status = 415
    reason = "content_type"


class OverLimit(IngestError):
    """A batch that would take the collector past one of its cardinality limits. `reason` names
    the limit (``too_many_jobs``, ``too_many_ranks``, ``too_many_axes``). With `retry_after_s`
    (capacity that frees up as silent jobs and ranks expire) it is a 429 the agent retries later,
    without (the batch itself is over the limit) a 400 it does not."""

    def __init__(
        self, field: str, message: str, *, reason: str, retry_after_s: float | None = None
    ) -> None:
        super().__init__(field, message)
        self.reason = reason
        self.status = 400 if retry_after_s is None else 429
        self.retry_after_s = retry_after_s
