"""AgentConfig: precedence argument > MFUSCOPE_* env > default, and validation."""

from __future__ import annotations

from pathlib import Path

import pytest
from mfuscope.agent.config import AgentConfig
from mfuscope.core.errors import ConfigError


def test_defaults_need_only_a_job() -> None:
    config = AgentConfig.resolve({"job": "j"}, env={})
    assert config.job == "j"
    assert config.collector_url is None
    assert config.profile is True
    assert config.profile_every_steps == 1000


@pytest.mark.parametrize(
    ("arguments", "env", "field", "expected"),
    [
        ({"job": "arg"}, {"MFUSCOPE_JOB": "env"}, "job", "arg"),
        ({}, {"MFUSCOPE_JOB": "env"}, "job", "env"),
        ({"job": None}, {"MFUSCOPE_JOB": "env"}, "job", "env"),
        ({"job": "j"}, {"MFUSCOPE_PEAK_FLOPS": "1e12"}, "peak_flops", 1e12),
        ({"job": "j", "peak_flops": 5e12}, {"MFUSCOPE_PEAK_FLOPS": "1e12"}, "peak_flops", 5e12),
        ({"job": "j"}, {"MFUSCOPE_PROFILE": "0"}, "profile", False),
        ({"job": "j"}, {"MFUSCOPE_PROFILE": "off"}, "profile", False),
        ({"job": "j", "profile": True}, {"MFUSCOPE_PROFILE": "0"}, "profile", True),
        ({"job": "j"}, {"MFUSCOPE_WRAP_CHECKPOINT": "yes"}, "wrap_checkpoint", True),
        ({"job": "j"}, {"MFUSCOPE_PROFILE_EVERY_STEPS": "50"}, "profile_every_steps", 50),
        ({"job": "j"}, {"MFUSCOPE_KEEP_TRACES": "5"}, "keep_traces", 5),
        ({"job": "j"}, {"MFUSCOPE_KEEP_TRACES_DIR": "/tmp/t"}, "keep_traces_dir", "/tmp/t"),
        (
            {"job": "j"},
            {"MFUSCOPE_COLLECTOR_URL": "http://c:9464"},
            "collector_url",
            "http://c:9464",
        ),
        ({"job": "j"}, {"MFUSCOPE_COLLECTOR_URL": ""}, "collector_url", None),
        ({"job": "j", "jsonl_path": Path("/tmp/x.jsonl")}, {}, "jsonl_path", "/tmp/x.jsonl"),
        ({"job": "j", "profile_steps": "4"}, {}, "profile_steps", 4),
        ({"job": "j"}, {"MFUSCOPE_FLOPS_PER_STEP": "3.5e14"}, "flops_per_step", 3.5e14),
        ({"job": "j", "flops_per_step": 7}, {}, "flops_per_step", 7.0),
    ],
)
def test_precedence(
    arguments: dict[str, object], env: dict[str, str], field: str, expected: object
) -> None:
    assert getattr(AgentConfig.resolve(arguments, env=env), field) == expected


@pytest.mark.parametrize(
    ("arguments", "env", "field", "source"),
    [
        ({}, {}, "job", "argument"),
        ({"job": ""}, {}, "job", "argument"),
        ({}, {"MFUSCOPE_JOB": "caf\udce9-run"}, "job", "MFUSCOPE_JOB"),
        ({"job": "\ud800"}, {}, "job", "argument"),
        ({"job": "j", "no_such_option": 1}, {}, "no_such_option", "argument"),
        (
            {"job": "j"},
            {"MFUSCOPE_PROFILE_STEPS": "many"},
            "profile_steps",
            "MFUSCOPE_PROFILE_STEPS",
        ),
        ({"job": "j"}, {"MFUSCOPE_PROFILE": "maybe"}, "profile", "MFUSCOPE_PROFILE"),
        ({"job": "j", "peak_flops": -1.0}, {}, "peak_flops", "argument"),
        ({"job": "j", "peak_flops": float("nan")}, {}, "peak_flops", "argument"),
        ({"job": "j", "flops_per_step": float("inf")}, {}, "flops_per_step", "argument"),
        ({"job": "j", "collector_url": "127.0.0.1:9464"}, {}, "collector_url", "argument"),
        ({"job": "j", "profile_steps": 0}, {}, "profile_steps", "argument"),
        ({"job": "j", "profile_steps": 2.5}, {}, "profile_steps", "argument"),
        ({"job": "j", "profile": 1}, {}, "profile", "argument"),
        (
            {"job": "j", "profile_max_overhead_ratio": 0.0},
            {},
            "profile_max_overhead_ratio",
            "argument",
        ),
        ({"job": "j", "request_timeout_s": 0.0}, {}, "request_timeout_s", "argument"),
        ({"job": "j", "flush_interval_s": -1.0}, {}, "flush_interval_s", "argument"),
    ],
)
def test_bad_values_name_field_and_source(
    arguments: dict[str, object], env: dict[str, str], field: str, source: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        AgentConfig.resolve(arguments, env=env)
    assert caught.value.field == field
    if field != "job" or arguments:
        assert caught.value.source == source


def test_environment_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MFUSCOPE_JOB", "from-os")
    monkeypatch.setenv("MFUSCOPE_PROFILE_STEPS", "5")
    config = AgentConfig.resolve({})
    assert (config.job, config.profile_steps) == ("from-os", 5)


def test_derived_values_fill_in_only_what_the_user_left_unset() -> None:
    derived = {"job": "from-framework", "flops_per_step": 1e12, "profile_steps": 7}
    env = {"MFUSCOPE_FLOPS_PER_STEP": "3e12"}
    config = AgentConfig.resolve({"profile_steps": 2}, env=env, derived=derived)
    # argument > environment > derived > default
    assert (config.job, config.flops_per_step, config.profile_steps) == ("from-framework", 3e12, 2)
    with pytest.raises(ConfigError) as caught:
        AgentConfig.resolve({"job": "j"}, env={}, derived={"profile_steps": 0})
    assert (caught.value.field, caught.value.source) == ("profile_steps", "derived")
    with pytest.raises(ConfigError, match="unknown option"):
        AgentConfig.resolve({"job": "j"}, env={}, derived={"no_such_option": 1})


def test_option_is_what_the_user_set_or_the_default() -> None:
    assert AgentConfig.option("count_flops", {}, env={"MFUSCOPE_COUNT_FLOPS": "0"}) is False
    assert AgentConfig.option("count_flops", {"count_flops": True}, env={}) is True
    assert AgentConfig.option("count_flops", {}, env={}) is True  # the default
    assert AgentConfig.option("flops_per_step", {}, env={"MFUSCOPE_FLOPS_PER_STEP": "5"}) == 5.0
    assert AgentConfig.option("flops_per_step", {"flops_per_step": None}, env={}) is None
    with pytest.raises(ConfigError, match="unknown option"):
        AgentConfig.option("no_such_option", {}, env={})


def test_the_run_key_from_the_option_or_mfuscope_run_key() -> None:
    env = {"MFUSCOPE_JOB": "j", "MFUSCOPE_RUN_KEY": "llama-70b nightly"}
    assert AgentConfig.resolve({}, env=env).run_key == "llama-70b nightly"
    assert AgentConfig.resolve({"run_key": "mine"}, env=env).run_key == "mine"
    assert AgentConfig.resolve({"job": "j"}, env={}).run_key is None  # the fingerprint
    with pytest.raises(ConfigError, match="run_key"):
        AgentConfig.resolve({"job": "j", "run_key": "a\nb"}, env={})
