"""Axis names the agent gives groups (framework table, user mapping) and the gloo worker-thread
map it discovers (pure assignment, discovery against a fake /proc tree, the kept trace's copy)."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mfuscope.agent._kept_traces import TraceKeeper
from mfuscope.agent._topology import (
    GroupSpec,
    _threads_named,
    assign_gloo_workers,
    axis_of_group,
    build_topology,
)
from mfuscope.agent.config import AgentConfig
from mfuscope.core.errors import ConfigError
from mfuscope.core.trace.worker_groups import TRACE_KEY, trace_fields, worker_groups_from_trace


@pytest.mark.parametrize(
    ("spec", "mesh_axes", "expected"),
    [
        (GroupSpec("1", "TENSOR_MODEL_PARALLEL_GROUP", (0, 1)), {}, "tp"),
        (GroupSpec("2", "PIPELINE_MODEL_PARALLEL_GROUP", (0, 2)), {}, "pp"),
        (GroupSpec("3", "DATA_PARALLEL_GROUP_GLOO", (0, 2)), {}, "dp"),
        (GroupSpec("4", "mesh_tensor_parallel", (0, 1)), {}, "tp"),
        (GroupSpec("5", "mesh_data_parallel", (0, 2)), {"5": "data_parallel"}, "dp"),
        (GroupSpec("6", "MY_OWN_GROUP", (0, 1)), {}, "MY_OWN_GROUP"),
    ],
)
def test_framework_names(spec: GroupSpec, mesh_axes: dict[str, str], expected: str) -> None:
    assert axis_of_group(spec, mesh_axes) == expected


@pytest.mark.parametrize("key", ["7", "MY_OWN_GROUP", "rows"])
def test_user_mapping_by_name_description_or_mesh_dim(key: str) -> None:
    spec = GroupSpec("7", "MY_OWN_GROUP", (0, 1))
    assert axis_of_group(spec, {"7": "rows"}, {key: "tp"}) == "tp"


def test_megatron_tp_group_across_hosts_is_flagged() -> None:
    topology = build_topology(
        rank=0,
        local_rank=0,
        hosts=["a", "b"],
        groups=[GroupSpec("1", "TENSOR_MODEL_PARALLEL_GROUP", (0, 1))],
    )
    assert topology.tp_spans_hosts
    renamed = build_topology(
        rank=0,
        local_rank=0,
        hosts=["a", "b"],
        groups=[GroupSpec("1", "MY_TP", (0, 1))],
        axis_overrides={"MY_TP": "tp"},
    )
    assert renamed.tp_spans_hosts and renamed.axis_of_group_name == {"1": "tp"}


def test_axis_overrides_from_the_environment() -> None:
    env = {"MFUSCOPE_JOB": "j", "MFUSCOPE_AXIS_OVERRIDES": "MY_TP=tp, 3=dp"}
    assert AgentConfig.resolve({}, env).axis_overrides == {"MY_TP": "tp", "3": "dp"}
    given = AgentConfig.resolve({"axis_overrides": {"x": "pp"}}, env)
    assert given.axis_overrides == {"x": "pp"}  # the argument wins
    with pytest.raises(ConfigError, match="axis_overrides"):
        AgentConfig.resolve({}, {**env, "MFUSCOPE_AXIS_OVERRIDES": "MY_TP"})
    with pytest.raises(ConfigError, match="axis_overrides"):
        AgentConfig.resolve({"job": "j", "axis_overrides": {"x": ""}}, {})


def test_worker_threads_split_in_creation_order() -> None:
    groups = [("0", 2), ("1", 2), ("3", 2)]
    tids = [305, 300, 311, 301, 310, 306]
    assert assign_gloo_workers(groups, tids) == {
        300: "0",
        301: "0",
        305: "1",
        306: "1",
        310: "3",
        311: "3",
    }


@pytest.mark.parametrize(
    "tids",
    [
        [300, 301, 305, 306, 310],  # one thread missing
        [300, 301, 305, 306, 310, 311, 320],  # an unlisted group's thread
        [300, 300, 305, 306, 310, 311],  # repeated
    ],
)
def test_a_thread_count_that_does_not_match_gives_no_map(tids: list[int]) -> None:
    assert assign_gloo_workers([("0", 2), ("1", 2), ("3", 2)], tids) is None


def test_no_gloo_groups_give_no_map() -> None:
    assert assign_gloo_workers([], []) is None


def test_threads_are_found_by_their_name(tmp_path: Path) -> None:
    for tid, name in [(10, "python"), (12, "pt_gloo_runloop"), (13, "gloo_tcp_loop"), (14, "")]:
        (tmp_path / str(tid)).mkdir()
        (tmp_path / str(tid) / "comm").write_text(name + "\n")
    (tmp_path / "15").mkdir()  # exited: no comm file
    assert _threads_named("pt_gloo_runloop", str(tmp_path)) == [12]


@pytest.mark.parametrize(
    "text",
    [
        '{"traceEvents": [], "distributedInfo": {"rank": 0}}',
        '  \n{ "traceEvents": []}',
        "{}",
    ],
)
def test_kept_traces_carry_the_map(tmp_path: Path, text: str) -> None:
    source = tmp_path / "window.json"
    source.write_text(text)
    keeper = TraceKeeper(tmp_path / "kept", keep=2, max_bytes=1 << 20, rank=0)
    fields = {TRACE_KEY: trace_fields({101: "0", 121: "3"})}
    kept = keeper.keep_trace(str(source), (1, 2), fields)
    document = json.loads(gzip.decompress(kept.read_bytes()))
    assert worker_groups_from_trace(document[TRACE_KEY]) == {101: "0", 121: "3"}
    assert {k: v for k, v in document.items() if k != TRACE_KEY} == json.loads(text)


@given(
    counts=st.lists(st.integers(1, 4), min_size=1, max_size=6),
    gaps=st.lists(st.integers(1, 50), min_size=24, max_size=24),
    order=st.randoms(use_true_random=False),
)
def test_each_group_gets_its_own_run_of_thread_ids(
    counts: list[int], gaps: list[int], order: random.Random
) -> None:
    groups = [(str(i), n) for i, n in enumerate(counts)]
    tids, tid = [], 1000
    for i in range(sum(counts)):
        tid += gaps[i]
        tids.append(tid)
    expected = dict(zip(tids, [name for name, n in groups for _ in range(n)], strict=True))
    shuffled = list(tids)
    order.shuffle(shuffled)  # /proc lists threads in no promised order
    assert assign_gloo_workers(groups, shuffled) == expected
