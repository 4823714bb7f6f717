"""Configuration: argument > MFUSCOPE_* environment > default; the loopback/token rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mfuscope.cli import build_parser
from mfuscope.collector._auth import is_loopback
from mfuscope.collector.app import CollectorConfig, parse_listen, resolve_config


def _cli(*argv: str) -> dict[str, Any]:
    args = vars(build_parser().parse_args(["collector", *argv]))
    return {k: v for k, v in args.items() if k not in ("command", "log_level")}


@pytest.mark.parametrize(
    ("argv", "env", "field", "expected"),
    [
        ((), {}, "expire_after_s", 300.0),
        ((), {"MFUSCOPE_EXPIRE_AFTER_S": "60"}, "expire_after_s", 60.0),
        (("--expire-after", "5"), {"MFUSCOPE_EXPIRE_AFTER_S": "60"}, "expire_after_s", 5.0),
        ((), {}, "per_rank_labels", False),
        ((), {"MFUSCOPE_PER_RANK_LABELS": "yes"}, "per_rank_labels", True),
        (("--per-rank-labels",), {"MFUSCOPE_PER_RANK_LABELS": "0"}, "per_rank_labels", True),
        ((), {}, "listen", "127.0.0.1:9464"),
        ((), {"MFUSCOPE_LISTEN": "127.0.0.1:0"}, "listen", "127.0.0.1:0"),
        (("--rate-limit", "0"), {"MFUSCOPE_RATE_LIMIT_PER_S": "7"}, "rate_limit_per_s", 0.0),
        ((), {"MFUSCOPE_RATE_LIMIT_PER_S": "7"}, "rate_limit_per_s", 7.0),
        ((), {"MFUSCOPE_OTLP_ENDPOINT": "http://o:4318"}, "otlp_endpoint", "http://o:4318"),
        (("--window-steps", "7"), {}, "window_steps", 7),
        (("--max-body-bytes", "4096"), {}, "max_body_bytes", 4096),
    ],
)
def test_precedence(argv: tuple[str, ...], env: dict[str, str], field: str, expected: Any) -> None:
    assert getattr(resolve_config(_cli(*argv), env), field) == expected


def test_every_cli_option_maps_to_a_config_field() -> None:
    fields = set(CollectorConfig.__dataclass_fields__) - {"token"}
    assert set(_cli()) - {"token_file"} == fields


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MFUSCOPE_EXPIRE_AFTER_S": "soon"}, "MFUSCOPE_EXPIRE_AFTER_S"),
        ({"MFUSCOPE_PER_RANK_LABELS": "maybe"}, "MFUSCOPE_PER_RANK_LABELS"),
        ({"MFUSCOPE_EXPIRE_AFTER_S": "0"}, "expire_after_s"),
        ({"MFUSCOPE_LISTEN": "9464"}, "HOST:PORT"),
        ({"MFUSCOPE_LISTEN": "0.0.0.0:9464"}, "requires a token"),
        ({"MFUSCOPE_MAX_BODY_BYTES": "10"}, "max_body_bytes"),
        ({"MFUSCOPE_OTLP_INTERVAL_S": "0"}, "otlp_interval_s"),
    ],
)
def test_bad_settings_name_the_setting(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_config(_cli(), env)


def test_token_sources(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("  from-file\n")
    public = ("--listen", "0.0.0.0:9464")
    assert resolve_config(_cli(*public, "--token-file", str(token_file)), {}).token == "from-file"
    env = {"MFUSCOPE_TOKEN_FILE": str(token_file), "MFUSCOPE_TOKEN": "from-env"}
    assert resolve_config(_cli(*public), env).token == "from-file"
    assert resolve_config(_cli(*public), {"MFUSCOPE_TOKEN": "from-env"}).token == "from-env"
    assert resolve_config(_cli(), {}).token is None  # loopback: no token needed
    token_file.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        resolve_config(_cli("--token-file", str(token_file)), {})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:9464", ("127.0.0.1", 9464)),
        ("[::1]:0", ("::1", 0)),
        ("collector.local:80", ("collector.local", 80)),
    ],
)
def test_parse_listen(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", ["9464", ":9464", "host:", "host:http", "host:70000"])
def test_parse_listen_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_listen(text)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("collector.example", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
