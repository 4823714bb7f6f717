"""The collector's HTTP API, independent of the HTTP server that carries it.

- ``POST /v1/reports``: one batch (``Content-Type: application/json``, optionally
  ``Content-Encoding: gzip``), optional ``Authorization: Bearer <token>`` ->
  ``200 {"accepted": N, "duplicates": M}``; refusals ``400/401/413/415/429`` with
  ``{"error": "...", "field": "..."}``. The rate limit is checked first, before the token, so a
  flood of unauthenticated requests costs a token-bucket lookup each and nothing more.
- ``GET /metrics``: Prometheus exposition (classic text, or OpenMetrics if the scrape asks).
- ``GET /healthz``: ``200 {"status": "ok"}``.
- ``GET /v1/summary``: the JSON digest of `summary.py`.

The server adapter calls `before_body` with the headers (so a refused request is answered
without reading its body), then `handle` with the body.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from mfuscope.collector._aggregator import Aggregator
from mfuscope.collector._auth import check_bearer
from mfuscope.collector._errors import IngestError, PayloadTooLarge, UnsupportedMediaType
from mfuscope.collector._ratelimit import RateLimiter
from mfuscope.collector._summary import summary
from mfuscope.exporters.prometheus import new_registry, render

__all__ = ["REPORTS_PATH", "HttpRequest", "HttpResponse", "Routes"]

REPORTS_PATH = "/v1/reports"
_JSON = "application/json"
_GET_PATHS = frozenset({"/metrics", "/healthz", "/v1/summary"})


@dataclass(frozen=True)
class HttpRequest:
    """What the API needs from a request. `client` is the peer address (the rate-limit key)."""

    method: str
    path: str
    client: str
    authorization: str | None = None
    content_length: int | None = None
    content_encoding: str = ""
    accept: str = ""
    content_type: str = _JSON


def _is_json(content_type: str) -> bool:
    """``application/json``, with parameters (``; charset=utf-8``) or not, in any case."""
    return content_type.partition(";")[0].strip().lower() == _JSON


@dataclass(frozen=True)
class HttpResponse:
    status: int
    body: bytes
    content_type: str = _JSON
    headers: tuple[tuple[str, str], ...] = ()


def _json(status: int, payload: Any, headers: tuple[tuple[str, str], ...] = ()) -> HttpResponse:
    body = json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()
    return HttpResponse(status=status, body=body, headers=headers)


def _error(status: int, field: str, message: str) -> HttpResponse:
    return _json(status, {"error": message, "field": field})


class Routes:
    """The API over one `Aggregator`. `token` None: no authentication (loopback only, enforced at
    start-up); `rate_limiter` None: no rate limit."""

    def __init__(
        self,
        collector: Aggregator,
        *,
        token: str | None = None,
        rate_limiter: RateLimiter | None = None,
    ) -> None:
        self.collector = collector
        self._token = token
        self._rate_limiter = rate_limiter
        self._registry = new_registry(collector.families)

    @property
    def max_body_bytes(self) -> int:
        return self.collector.max_body_bytes

    def refuse(self, error: IngestError) -> HttpResponse:
        """Count `error` as a rejected batch and turn it into its response."""
        self.collector.count_rejection(error)
        return self._error_response(error)

    @staticmethod
    def _error_response(error: IngestError) -> HttpResponse:
        retry = getattr(error, "retry_after_s", None)
        headers = (("Retry-After", str(max(1, math.ceil(retry)))),) if retry is not None else ()
        return _json(error.status, error.to_json(), headers)

    def before_body(self, request: HttpRequest) -> HttpResponse | None:
        """A response if the request can be answered from its headers alone, else None."""
        if request.path == REPORTS_PATH:
            if request.method != "POST":
                return _error(405, "method", f"{request.method} not allowed on {request.path}")
            try:
                # Rate limit first: a client flooding the port with bad or missing tokens is
                # throttled (429, counted as rate_limited) before its token is even compared.
                if self._rate_limiter is not None:
                    self._rate_limiter.check(request.client)
                check_bearer(request.authorization, self._token)
                if not _is_json(request.content_type):
                    raise UnsupportedMediaType(
                        "content-type",
                        f"expected application/json, got {request.content_type[:100]!r}",
                    )
                if request.content_length is not None and (
                    request.content_length > self.max_body_bytes
                ):
                    raise PayloadTooLarge("body", f"body is over {self.max_body_bytes} bytes")
            except IngestError as exc:
                return self.refuse(exc)
            return None
        if request.path not in _GET_PATHS:
            return _error(404, "path", f"no such endpoint {request.path}")
        if request.method not in ("GET", "HEAD"):
            return _error(405, "method", f"{request.method} not allowed on {request.path}")
        return None

    def handle(self, request: HttpRequest, body: bytes) -> HttpResponse:
        """Answer a request that `before_body` let through."""
        if request.path == REPORTS_PATH:
            try:
                result = self.collector.ingest(body, content_encoding=request.content_encoding)
            except IngestError as exc:  # counted by the collector already
                return self._error_response(exc)
            return _json(200, {"accepted": result.accepted, "duplicates": result.duplicates})
        if request.path == "/metrics":
            text, content_type = render(self._registry, request.accept)
            return HttpResponse(status=200, body=text, content_type=content_type)
        if request.path == "/v1/summary":
            return _json(200, summary(self.collector.snapshot()))
        return _json(200, {"status": "ok"})
