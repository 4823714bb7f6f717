"""A Hypothesis strategy for whole synthetic traces: steps, compute and recompute kernels, memory
copies and collectives on four groups of a 16-rank job (tp on one host, dp across two hosts, pp,
world), each drawn with where it was launched so the truth is known without the engine."""

from __future__ import annotations

from hypothesis import strategies as st

from tests.support.trace_builder import AUTOGRAD_TID, MAIN_TID, Group, TraceBuilder

__all__ = ["GROUPS", "OPS", "WORLD", "synthetic"]

WORLD = Group("0", "default_pg", tuple(range(16)))
GROUPS = {
    "tp": Group("1", "mesh_tp", tuple(range(8))),  # one host of 8: intra_node
    "dp": Group("2", "mesh_dp", (0, 8)),  # two hosts: inter_node
    "pp": Group("3", "mesh_pp", (0, 4)),  # intra_node
    "world": WORLD,
}

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send", "recv")


@st.composite
def synthetic(draw: st.DrawFn) -> TraceBuilder:
    b = TraceBuilder(world_size=16, groups=tuple(GROUPS.values()))
    n_steps = draw(st.integers(1, 3))
    t = 100
    cpu_steps = []
    for number in range(n_steps):
        length = draw(st.integers(20, 60))
        b.profiler_step(number + 5, float(t), float(t + length))
        cpu_steps.append((t, t + length))
        t += length + draw(st.integers(0, 5))
    # Recomputation is launched from the autograd thread inside an mfuscope::recompute range.
    b.annotation("mfuscope::recompute", 0.0, float(t + 1000), AUTOGRAD_TID)
    n_events = draw(st.integers(0, 12))
    for i in range(n_events):
        kind = draw(st.sampled_from(("compute", "recompute", "comm", "memcpy", "memset")))
        which = draw(st.integers(-1, n_steps - 1))
        if which < 0:
            launch = None
            start = draw(st.integers(60, 140))
        else:
            lo, hi = cpu_steps[which]
            launch = draw(st.integers(lo, hi))
            start = launch + draw(st.integers(0, 30))
        dur = float(draw(st.integers(1, 40)))
        stream = draw(st.sampled_from((7, 8, 40, 41)))
        launch_at = None if launch is None else float(launch)
        if kind in ("compute", "recompute"):
            b.kernel(
                float(start),
                dur,
                stream=stream,
                launch_at=launch_at,
                launch_tid=AUTOGRAD_TID if kind == "recompute" else MAIN_TID,
                recompute=kind == "recompute" and launch is not None,
            )
        elif kind == "memcpy":
            b.memcpy(float(start), dur, stream=stream, launch_at=launch_at)
        elif kind == "memset":
            b.memset(float(start), dur, stream=stream, launch_at=launch_at)
        else:
            axis = draw(st.sampled_from(tuple(GROUPS)))
            op = draw(st.sampled_from(OPS))
            metadata = draw(st.sampled_from(("kernel", "rpc", "rpc_enclosing")))
            if launch_at is None:
                metadata = "kernel"
            b.comm_kernel(
                float(start),
                dur,
                op=op,
                nelems=draw(st.integers(1, 5000)),
                group=GROUPS[axis],
                metadata=metadata,
                stream=stream,
                launch_at=launch_at,
                launch_tid=5000 + i,  # one record_param_comms per thread: never nested
            )
    return b
