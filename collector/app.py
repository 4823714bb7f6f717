"""Wiring: configuration (argument > environment ``MFUSCOPE_*`` > default) and the running process.

`resolve_config` builds a validated `CollectorConfig` from parsed arguments and the environment;
`run` serves until SIGINT/SIGTERM. Once listening, the process prints
``mfuscope collector listening on http://HOST:PORT`` on stdout and, with `address_file`, writes
``HOST:PORT`` to that file (atomically), so a supervisor or test can use port 0.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import os
import signal
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from mfuscope.collector._aggregator import Aggregator
from mfuscope.collector._auth import is_loopback, read_token_file
from mfuscope.collector._clock import Clock, SystemClock
from mfuscope.collector._ingest import DEFAULT_MAX_BODY_BYTES
from mfuscope.collector._ratelimit import RateLimiter
from mfuscope.collector._routes import Routes
from mfuscope.collector._server import ServerLimits, bind_socket, serve_until
from mfuscope.collector._state import StateConfig
from mfuscope.core.settings import env_name, parse_setting_text, pick_settings

__all__ = ["CollectorConfig", "parse_listen", "resolve_config", "run"]
_log = logging.getLogger(__name__)


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 as ``[::1]:PORT``) -> (host, port). Raises ValueError."""
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    port = int(port_text)
    if port > 65535:
        raise ValueError(f"port {port} out of range")
    return host.strip("[]"), port


@dataclass(frozen=True)
class CollectorConfig:
    """Everything the collector process needs, validated. `token` None means no authentication,
    which is allowed only on a loopback address. `rate_limit_per_s` 0 turns rate limiting off.
    The cardinality limits (`max_jobs`, `max_ranks_per_job`, `max_axes_per_job`) and the slow-client
    bounds (`header_timeout_s`, `body_timeout_s`, `max_connections`) are in docs/collector.md."""

    listen: str = "127.0.0.1:9464"
    token: str | None = None
    per_rank_labels: bool = False
    expire_after_s: float = 300.0
    window_steps: int = 20
    straggler_top: int = 3
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    rate_limit_per_s: float = 50.0
    rate_burst: float = 100.0
    otlp_endpoint: str | None = None
    otlp_interval_s: float = 15.0
    address_file: str | None = None
    max_jobs: int = StateConfig.max_jobs
    max_ranks_per_job: int = StateConfig.max_ranks_per_job
    max_axes_per_job: int = StateConfig.max_axes_per_job
    max_hang_suspects: int = StateConfig.max_hang_suspects
    arrival_sample_s: float = StateConfig.arrival_sample_s
    header_timeout_s: float = ServerLimits.header_timeout_s
    body_timeout_s: float = ServerLimits.body_timeout_s
    max_connections: int = ServerLimits.max_connections

    def __post_init__(self) -> None:
        host, _ = parse_listen(self.listen)
        if self.token is None and not is_loopback(host):
            raise ValueError(
                f"listening on {host} (not loopback) requires a token: "
                "pass --token-file or set MFUSCOPE_TOKEN_FILE / MFUSCOPE_TOKEN"
            )
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        if not (self.rate_limit_per_s >= 0 and math.isfinite(self.rate_limit_per_s)):
            raise ValueError(f"rate_limit_per_s must be >= 0, got {self.rate_limit_per_s}")
        if self.rate_limit_per_s and self.rate_burst < 1:
            raise ValueError(f"rate_burst must be >= 1, got {self.rate_burst}")
        if not self.otlp_interval_s > 0:
            raise ValueError(f"otlp_interval_s must be > 0, got {self.otlp_interval_s}")
        self.state_config()  # validates the aggregation settings
        self.server_limits()  # and the slow-client bounds

    @property
    def host_port(self) -> tuple[str, int]:
        return parse_listen(self.listen)

    def state_config(self) -> StateConfig:
        return StateConfig(
            per_rank_labels=self.per_rank_labels,
            expire_after_s=self.expire_after_s,
            window_steps=self.window_steps,
            straggler_top=self.straggler_top,
            max_jobs=self.max_jobs,
            max_ranks_per_job=self.max_ranks_per_job,
            max_axes_per_job=self.max_axes_per_job,
            max_hang_suspects=self.max_hang_suspects,
            arrival_sample_s=self.arrival_sample_s,
        )

    def server_limits(self) -> ServerLimits:
        return ServerLimits(
            header_timeout_s=self.header_timeout_s,
            body_timeout_s=self.body_timeout_s,
            max_connections=self.max_connections,
        )


def resolve_config(args: Mapping[str, Any], env: Mapping[str, str]) -> CollectorConfig:
    """Each setting from `args` (a parsed value, None if not given), else ``MFUSCOPE_<NAME>`` in
    `env`, else the default. The token comes from ``token_file`` (argument, then
    ``MFUSCOPE_TOKEN_FILE``), else from ``MFUSCOPE_TOKEN``. Raises ValueError naming the setting."""
    annotations = {f.name: str(f.type) for f in fields(CollectorConfig) if f.name != "token"}
    values: dict[str, Any] = {}
    for name, setting in pick_settings(annotations, args, env).items():
        value = setting.value
        if setting.from_env:
            try:
                value = parse_setting_text(str(value), annotations[name])
            except ValueError as exc:
                raise ValueError(f"{setting.source}: {exc}") from None
        if value is not None:
            values[name] = value
    token_file = args.get("token_file") or env.get(env_name("token_file"))
    if token_file:
        values["token"] = read_token_file(token_file)
    elif env.get(env_name("token"), "").strip():
        values["token"] = env[env_name("token")].strip()
    return CollectorConfig(**values)


def _write_address(path: str, address: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(address + "\n")
    os.replace(tmp, path)


def _announce(config: CollectorConfig) -> Callable[[tuple[str, int]], None]:
    def announce(address: tuple[str, int]) -> None:
        host, port = address
        text = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        print(f"mfuscope collector listening on http://{text}", flush=True)
        if config.address_file:
            _write_address(config.address_file, text)

    return announce


def build_routes(config: CollectorConfig, clock: Clock) -> Routes:
    """The collector and its HTTP routes (token, rate limit) as `config` says; any server can
    serve them (aiohttp here, the stdlib one in benchmarks/)."""
    collector = Aggregator(config.state_config(), clock=clock, max_body_bytes=config.max_body_bytes)
    limiter = (
        RateLimiter(config.rate_limit_per_s, config.rate_burst, monotonic=clock.monotonic)
        if config.rate_limit_per_s
        else None
    )
    return Routes(collector, token=config.token, rate_limiter=limiter)


async def _serve(config: CollectorConfig, clock: Clock, sock: socket.socket) -> None:
    routes = build_routes(config, clock)
    collector = routes.collector
    pusher = None
    if config.otlp_endpoint:
        from mfuscope.exporters.otlp import (
            OtlpPusher,
            collector_resource,
            new_otlp_http_exporter,
        )

        # host:port: sidecars of one job on one host (or tests) stay distinct OTLP instances.
        instance_id = f"{socket.gethostname()}:{sock.getsockname()[1]}"
        pusher = OtlpPusher(
            collector.families,
            new_otlp_http_exporter(config.otlp_endpoint),
            interval_s=config.otlp_interval_s,
            resource=collector_resource(instance_id),
            clock_ns=clock.time_ns,
        )
        pusher.start()
    # Everything allocated so far (modules, classes, the HTTP stack) lives as long as the
    # process: move it out of the garbage collector's sight so full collections, which stall the
    # event loop, walk only the per-rank state (gc.freeze is meant for exactly this).
    gc.collect()
    gc.freeze()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await serve_until(routes, sock, stop, _announce(config), config.server_limits())
    finally:
        if pusher is not None:
            # Off the event loop: the final export is a blocking HTTP request.
            await loop.run_in_executor(None, pusher.stop)


def run(config: CollectorConfig, *, clock: Clock | None = None) -> int:
    """Serve until SIGINT/SIGTERM; returns the exit code."""
    try:
        sock = bind_socket(*config.host_port)
    except OSError as exc:
        print(f"mfuscope collector: cannot listen on {config.listen}: {exc}", file=sys.stderr)
        return 1
    asyncio.run(_serve(config, clock or SystemClock(), sock))
    return 0
