"""Bearer-token authentication of agents, and the loopback rule.

The token is compared in constant time (`hmac.compare_digest`) so response timing does not leak
how much of a guess was right. A collector listening beyond loopback must have a token: anyone on
the network could otherwise write counters into Prometheus.
"""

from __future__ import annotations

import hmac
import ipaddress

from mfuscope.collector._errors import Unauthorized

__all__ = ["check_bearer", "is_loopback", "read_token_file"]

_SCHEME = "bearer "


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1), in brackets or not."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_bearer(authorization: str | None, token: str | None) -> None:
    """Raise `Unauthorized` unless `authorization` is ``Bearer <token>``. No token: no check."""
    if token is None:
        return
    if authorization is None:
        raise Unauthorized("authorization", "missing bearer token")
    if authorization[: len(_SCHEME)].lower() != _SCHEME:
        raise Unauthorized("authorization", "expected 'Bearer <token>'")
    offered = authorization[len(_SCHEME) :].strip().encode("utf-8", "surrogateescape")
    if not hmac.compare_digest(offered, token.encode("utf-8")):
        raise Unauthorized("authorization", "wrong bearer token")


def read_token_file(path: str) -> str:
    """The token in `path`, surrounding whitespace removed. Raises ValueError if empty."""
    with open(path, encoding="utf-8") as f:
        token = f.read().strip()
    if not token:
        raise ValueError(f"token file {path} is empty")
    if any(ch.isspace() for ch in token):
        raise ValueError(f"token in {path} contains whitespace")
    return token
