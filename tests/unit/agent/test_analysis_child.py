"""A window's analysis in a child process: the protocol, the same answer as on the thread, and the
way back to the thread when the child cannot be used."""

from __future__ import annotations

import io
import json
import pickle
import struct
import sys
from pathlib import Path
from typing import Any

import pytest
from mfuscope.agent._analysis_child import (
    AnalysisFailed,
    ChildAnalysis,
    analyse_in_process,
    main,
)
from mfuscope.core.trace.options import analysis_options

from tests.support.trace_builder import GLOO_TIDS, TraceBuilder


def _request(*requests: tuple[str, Any]) -> io.BytesIO:
    stream = io.BytesIO()
    for request in requests:
        body = pickle.dumps(request)
        stream.write(struct.pack("<Q", len(body)) + body)
    stream.seek(0)
    return stream


def _answers(stream: io.BytesIO) -> list[Any]:
    stream.seek(0)
    answers = []
    while header := stream.read(8):
        (size,) = struct.unpack("<Q", header)
        answers.append(pickle.loads(stream.read(size)))
    return answers


def test_the_child_answers_each_request_until_its_input_ends() -> None:
    def analyse(path: str, options: Any) -> list[str]:
        if path == "bad":
            raise ValueError("not a trace")
        return [path, options]

    out = io.BytesIO()
    main(_request(("a.json", 7), ("bad", 0), ("b.json", 8)), out, analyse)
    answers = _answers(out)
    assert [a[:2] for a in answers] == [
        ("ok", ("a.json", 7)),
        ("error", "ValueError: not a trace"),
        ("ok", ("b.json", 8)),
    ]
    assert all(a[2] >= 0 for a in answers)  # the CPU time each took


def _gloo_trace(path: Path) -> Path:
    """Two CPU steps, each 6 ms of compute then a 4 ms all_reduce nothing overlaps."""
    builder = TraceBuilder(world_size=2)
    builder.thread_name(GLOO_TIDS[0], "pt_gloo_runloop")
    for step in range(2):
        start = 1_000.0 + step * 10_000.0
        builder.profiler_step(step, start, start + 10_000.0)
        builder.cpu_op("aten::mm", start, start + 6_000.0)
        builder.gloo("all_reduce", start + 6_000.0, 4_000.0, nelems=1 << 18)
    path.write_text(json.dumps(builder.build()))
    return path


@pytest.mark.slow
def test_a_child_process_gives_the_thread_s_answer(tmp_path: Path) -> None:
    trace = _gloo_trace(tmp_path / "trace.json")
    options = analysis_options(device=None)
    here = analyse_in_process(str(trace), options)
    child = ChildAnalysis()
    try:
        there = child(str(trace), options)
        assert not child.fallback
        assert [s.exposed_comm_s for s in there] == [s.exposed_comm_s for s in here]
        assert [s.compute_s for s in there] == pytest.approx([0.006, 0.006])
        assert child.cpu_s > 0
        # an analysis that fails there fails here with its error, and the child goes on
        (tmp_path / "empty.json").write_text('{"traceEvents": []}')
        with pytest.raises(AnalysisFailed, match="TraceError"):
            child(str(tmp_path / "empty.json"), options)
        assert len(child(str(trace), options)) == 2 and not child.fallback
    finally:
        child.close()


@pytest.mark.slow
def test_a_child_that_cannot_run_hands_the_analysis_back_to_the_thread(tmp_path: Path) -> None:
    trace = _gloo_trace(tmp_path / "trace.json")
    options = analysis_options(device=None)
    told: list[str] = []
    missing = ChildAnalysis([str(tmp_path / "no-such-python")], on_fallback=told.append)
    assert len(missing(str(trace), options)) == 2
    assert missing.fallback and missing.why is not None and "FileNotFoundError" in missing.why
    assert len(missing(str(trace), options)) == 2
    assert told == [missing.why]  # once
    # one that starts but answers nothing (it exits at once)
    silent = ChildAnalysis([sys.executable, "-c", "pass"])
    assert len(silent(str(trace), options)) == 2
    assert silent.fallback
    silent.close()
