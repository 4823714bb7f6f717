"""Job-level aggregation over step reports: the numbers `mfuscope report` shows.

`run` gathers agent batches (or trace analyses) into one job's `RunData`; `decompose` gives the
per-rank step decomposition, the job's MFU waterfall and MFU/HFU per step (ratios of sums, by the
`core.mfu` definitions); `stragglers` each rank's pace (by `core.stragglers`); `bandwidth` the
bus bandwidth per tier with its alpha-beta fit (`core.comm_fit`). Pure: plain data in, plain data
out. Import the submodule you need.
"""

from __future__ import annotations

__all__: list[str] = []
