"""The training thread's clock: its schedstat file and lines."""

from __future__ import annotations

from pathlib import Path

import pytest
from mfuscope.agent._thread_clock import ThreadTimes, open_thread_clock, thread_times


def test_a_schedstat_line_parses_and_anything_else_is_refused() -> None:
    assert thread_times(b"25081370 3301 41\n") == ThreadTimes(25081370, 3301)
    for bad in (b"", b"12\n", b"a b c"):
        with pytest.raises(ValueError):
            thread_times(bad)


def test_no_clock_where_the_file_is_missing_or_counts_nothing(tmp_path: Path) -> None:
    assert open_thread_clock(str(tmp_path / "missing")) is None
    silent = tmp_path / "schedstat"
    silent.write_text("0 0 0\n")  # a kernel without scheduler statistics
    assert open_thread_clock(str(silent)) is None
    counting = tmp_path / "counting"
    counting.write_text("1500 20 3\n")
    clock = open_thread_clock(str(counting))
    assert clock is not None and clock.read() == b"1500 20 3\n"
