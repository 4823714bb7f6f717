"""A run's summary over the step reports of all its ranks: the numbers `mfuscope report` shows.

`run_data` gathers agent batches (or trace analyses) into one job's `RunData`; `breakdowns` gives
the per-rank step breakdown, the job's MFU waterfall and MFU/HFU per step (ratios of sums, by the
`core.mfu` definitions); `rank_pace` each rank's pace (by `core.stragglers`); `tier_bandwidth`
the bus bandwidth per tier with its alpha-beta fit (`core.comm_fit`); `coverage` which steps
were measured and which carried; `kernel_classes` the compute time by kernel class;
`collective_totals` the collectives per op, axis and tier; `comparison` two runs' figures side by
side (`mfuscope compare`). Pure: plain data in, plain data out. Import the submodule you need.
"""

from __future__ import annotations

__all__: list[str] = []
