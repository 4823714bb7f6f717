"""``mfuscope collector``: ingest agent reports over HTTP, serve ``/metrics``, optionally push OTLP.

Every option can also come from the environment as ``MFUSCOPE_<OPTION>`` (e.g.
``MFUSCOPE_EXPIRE_AFTER_S=600``); an option given on the command line wins over the environment.
Never imports torch.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Defaults are None so that resolve_config can tell "not given" from a value and fall back to
    # the environment, then to CollectorConfig's defaults (shown in the help text).
    add = parser.add_argument
    add(
        "--listen",
        metavar="HOST:PORT",
        help="address to listen on (default 127.0.0.1:9464; "
        "port 0 picks a free port; a non-loopback host requires a token)",
    )
    add(
        "--token-file",
        metavar="FILE",
        help="file holding the bearer token agents must send "
        "(env MFUSCOPE_TOKEN_FILE, or the token itself in MFUSCOPE_TOKEN)",
    )
    add(
        "--per-rank-labels",
        action="store_true",
        default=None,
        help="add a `rank` label to per-job series (cardinality grows with the world size)",
    )
    add(
        "--expire-after",
        dest="expire_after_s",
        type=float,
        metavar="SECONDS",
        help="drop ranks silent this long, and jobs with no live rank (default 300)",
    )
    add(
        "--window-steps",
        type=int,
        metavar="N",
        help="steps per rank behind the latest MFU/HFU gauges and straggler times (default 20)",
    )
    add(
        "--straggler-top",
        type=int,
        metavar="K",
        help="how many slowest ranks get a straggler ratio series (default 3)",
    )
    add(
        "--max-body-bytes",
        type=int,
        metavar="BYTES",
        help="largest accepted batch, also after gzip decoding (default 16 MiB)",
    )
    add(
        "--rate-limit",
        dest="rate_limit_per_s",
        type=float,
        metavar="PER_S",
        help="requests/s allowed per client address, 0 = unlimited (default 50)",
    )
    add("--rate-burst", type=float, metavar="N", help="burst per client address (default 100)")
    add("--max-jobs", type=int, metavar="N", help="live jobs tracked at once (default 256)")
    add(
        "--max-ranks-per-job",
        type=int,
        metavar="N",
        help="live ranks tracked per job (default 65536)",
    )
    add(
        "--max-axes-per-job",
        type=int,
        metavar="N",
        help="distinct parallelism axes one job may name (default 16)",
    )
    add(
        "--max-hang-suspects",
        type=int,
        metavar="N",
        help="suspect ranks exported per job while it hangs (default 8)",
    )
    add(
        "--arrival-sample",
        dest="arrival_sample_s",
        type=float,
        metavar="SECONDS",
        help="one arrival sample per rank and cross-collector group per this period, for the "
        "arrival-skew rules (default 60)",
    )
    add(
        "--header-timeout",
        dest="header_timeout_s",
        type=float,
        metavar="SECONDS",
        help="time a connection has to send a request's headers (default 10)",
    )
    add(
        "--body-timeout",
        dest="body_timeout_s",
        type=float,
        metavar="SECONDS",
        help="time to send a request body once its headers are in (default 30)",
    )
    add(
        "--max-connections",
        type=int,
        metavar="N",
        help="open connections at once; more are closed on accept (default 512)",
    )
    add(
        "--otlp-endpoint",
        metavar="URL",
        help="push the same series over OTLP/HTTP to this URL (http://host:4318 gets /v1/metrics)",
    )
    add(
        "--otlp-interval",
        dest="otlp_interval_s",
        type=float,
        metavar="SECONDS",
        help="OTLP push interval (default 15)",
    )
    add(
        "--address-file",
        metavar="FILE",
        help="write the bound HOST:PORT here once listening (useful with port 0)",
    )
    add("--log-level", default="WARNING", help="Python logging level (default WARNING)")


def run(args: argparse.Namespace) -> int:
    from mfuscope.collector.app import resolve_config
    from mfuscope.collector.app import run as run_collector

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    settings = {k: v for k, v in vars(args).items() if k not in ("command", "log_level")}
    try:
        config = resolve_config(settings, os.environ)
    except (OSError, ValueError) as exc:
        print(f"mfuscope collector: {exc}", file=sys.stderr)
        return 2
    return run_collector(config)
