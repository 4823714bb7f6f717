"""Synthetic Kineto traces with a known truth, for tests and benchmarks.

`TraceBuilder` writes events the way torch.profiler / Kineto does (shapes checked against the
real traces in ``../shared/traces`` and gloo traces recorded with torch 2.13): CPU
``ProfilerStep#N`` user annotations, kernels / memcpys / memsets on device ``pid`` = device id
linked to a ``cuda_runtime`` launch by ``args.correlation`` (plus ``ac2g`` flow events), NCCL
kernels with collective metadata on the kernel and/or on a ``record_param_comms`` operator, and
for CPU-only runs ``gloo:<op>`` annotations on ``pt_gloo_runloop`` threads.

Times are microseconds (Kineto's unit). Every call also appends to `truth`, the list of what was
put on the timeline, so a test can compute the expected answer on its own without the engine.

Reusable by others: ``from tests.support.trace_builder import ...`` (the repository root on the
path, as pytest's ``pythonpath`` setting puts it).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "AUTOGRAD_TID",
    "CPU_PID",
    "MAIN_TID",
    "Group",
    "TraceBuilder",
    "TruthEvent",
    "realistic_trace",
]

CPU_PID = 4242
MAIN_TID = 4242
AUTOGRAD_TID = 4250
GLOO_TIDS = (4260, 4261)
DEVICE = 0

# nccl-tests op -> PyTorch `Collective name` and NCCL kernel name stem.
_COLL_NAME = {
    "all_reduce": ("allreduce", "AllReduce"),
    "all_gather": ("_allgather_base", "AllGather"),
    "reduce_scatter": ("_reduce_scatter_base", "ReduceScatter"),
    "all_to_all": ("all_to_all", "SendRecv"),
    "broadcast": ("broadcast", "Broadcast"),
    "reduce": ("reduce", "Reduce"),
    "send": ("send", "SendRecv"),
    "recv": ("recv", "SendRecv"),
    "barrier": ("barrier", "AllReduce"),
}
_DTYPE_BYTES = {"Float": 4, "BFloat16": 2, "Half": 2, "Long": 8, "Byte": 1}
_GLOO_TYPE = {
    "Float": "float",
    "BFloat16": "c10::BFloat16",
    "Long": "long int",
    "Half": "c10::Half",
}


@dataclass(frozen=True)
class Group:
    """A process group as PyTorch names it (``pg_desc`` ``mesh_tp`` means DeviceMesh dim tp)."""

    name: str
    desc: str
    ranks: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.ranks)


@dataclass(frozen=True)
class TruthEvent:
    """What the builder put on the timeline: `kind` is compute, recompute, comm or other.

    For comm: `op`, `group`, `bytes` (nccl-tests S) as they should be reported.
    `launch` is the host launch time (None: launched before the profiler started).
    """

    kind: str
    start: float
    end: float
    launch: float | None
    op: str | None = None
    group: Group | None = None
    bytes: int | None = None


@dataclass
class TraceBuilder:
    rank: int = 0
    world_size: int = 2
    gpu: bool = True
    device_name: str = "NVIDIA H100 80GB HBM3"
    groups: tuple[Group, ...] = (Group("0", "default_pg", (0, 1)),)
    base_time_ns: int = 1_700_000_000_000_000_000
    events: list[dict[str, Any]] = field(default_factory=list)
    truth: list[TruthEvent] = field(default_factory=list)
    steps: list[tuple[int, float, float]] = field(default_factory=list)
    _next_id: int = 1

    def _id(self) -> int:
        self._next_id += 1
        return self._next_id

    # --- host side ----------------------------------------------------------------------------

    def profiler_step(self, step: int, start: float, end: float, tid: int = MAIN_TID) -> None:
        self.steps.append((step, start, end))
        self.annotation(f"ProfilerStep#{step}", start, end, tid)

    def annotation(self, name: str, start: float, end: float, tid: int = MAIN_TID) -> None:
        self.events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": name,
                "pid": CPU_PID,
                "tid": tid,
                "ts": start,
                "dur": end - start,
                "args": {"External id": self._id(), "Record function id": 0},
            }
        )

    def cpu_op(self, name: str, start: float, end: float, tid: int = MAIN_TID, **args: Any) -> int:
        external = self._id()
        self.events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": name,
                "pid": CPU_PID,
                "tid": tid,
                "ts": start,
                "dur": end - start,
                "args": {"External id": external, "Record function id": 0, **args},
            }
        )
        return external

    def python_function(self, name: str, start: float, end: float, tid: int = MAIN_TID) -> None:
        self.events.append(
            {
                "ph": "X",
                "cat": "python_function",
                "name": name,
                "pid": CPU_PID,
                "tid": tid,
                "ts": start,
                "dur": end - start,
                "args": {"Python parent id": None, "Python id": self._id()},
            }
        )

    def thread_name(self, tid: int, name: str) -> None:
        self.events.append(
            {"ph": "M", "name": "thread_name", "pid": CPU_PID, "tid": tid, "args": {"name": name}}
        )

    # --- device side --------------------------------------------------------------------------

    def _device_event(
        self,
        cat: str,
        name: str,
        start: float,
        dur: float,
        *,
        stream: int,
        launch_at: float | None,
        launch_tid: int,
        external_id: int | None,
        extra: dict[str, Any] | None = None,
        flows: bool = True,
        launch: tuple[str, str] | None = None,
    ) -> None:
        """`launch`: the launch's (category, name); by default the runtime's
        ``cudaLaunchKernel`` / ``cudaMemcpyAsync``."""
        correlation = self._id()
        if launch_at is not None:
            ext = external_id if external_id is not None else self._id()
            launch_cat, launch_name = launch or (
                "cuda_runtime",
                "cudaLaunchKernel" if cat == "kernel" else "cudaMemcpyAsync",
            )
            self.events.append(
                {
                    "ph": "X",
                    "cat": launch_cat,
                    "name": launch_name,
                    "pid": CPU_PID,
                    "tid": launch_tid,
                    "ts": launch_at,
                    "dur": 1.0,
                    "args": {"External id": ext, "cbid": 211, "correlation": correlation},
                }
            )
            if flows:
                self.events.append(
                    {
                        "ph": "s",
                        "id": correlation,
                        "pid": CPU_PID,
                        "tid": launch_tid,
                        "ts": launch_at,
                        "cat": "ac2g",
                        "name": "ac2g",
                    }
                )
                self.events.append(
                    {
                        "ph": "f",
                        "id": correlation,
                        "pid": DEVICE,
                        "tid": stream,
                        "ts": start,
                        "cat": "ac2g",
                        "name": "ac2g",
                        "bp": "e",
                    }
                )
        args: dict[str, Any] = {
            "device": DEVICE,
            "stream": stream,
            "correlation": correlation,
            **(extra or {}),
        }
        if external_id is not None:
            args["External id"] = external_id
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": DEVICE,
                "tid": stream,
                "ts": start,
                "dur": dur,
                "args": args,
            }
        )

    def kernel(
        self,
        start: float,
        dur: float,
        *,
        stream: int = 7,
        name: str = "void gemm_kernel<float>(float*, float const*)",
        launch_at: float | None = None,
        launch_tid: int = MAIN_TID,
        recompute: bool = False,
    ) -> None:
        """A compute kernel; `recompute` only records the truth (wrap the launch in a range)."""
        self._device_event(
            "kernel",
            name,
            start,
            dur,
            stream=stream,
            launch_at=launch_at,
            launch_tid=launch_tid,
            external_id=None,
        )
        kind = "recompute" if recompute else "compute"
        self.truth.append(TruthEvent(kind, start, start + dur, launch_at))

    def memcpy(
        self, start: float, dur: float, *, stream: int = 7, launch_at: float | None = None
    ) -> None:
        self._memory_op(
            "gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", start, dur, stream, launch_at
        )

    def memset(
        self, start: float, dur: float, *, stream: int = 7, launch_at: float | None = None
    ) -> None:
        self._memory_op("gpu_memset", "Memset (Device)", start, dur, stream, launch_at)

    def _memory_op(
        self, cat: str, name: str, start: float, dur: float, stream: int, launch_at: float | None
    ) -> None:
        """A copy or memset: the `other` bucket when nothing else runs."""
        self._device_event(
            cat,
            name,
            start,
            dur,
            stream=stream,
            launch_at=launch_at,
            launch_tid=MAIN_TID,
            external_id=None,
            extra={"bytes": 4096},
        )
        self.truth.append(TruthEvent("other", start, start + dur, launch_at))

    def comm_kernel(
        self,
        start: float,
        dur: float,
        *,
        op: str = "all_reduce",
        nelems: int = 1 << 20,
        dtype: str = "Float",
        group: Group | None = None,
        metadata: str = "kernel",
        stream: int = 40,
        launch_at: float | None = None,
        launch_tid: int = MAIN_TID,
        kernel_name: str | None = None,
    ) -> None:
        """An NCCL kernel for one collective.

        `nelems` is the per-rank input count; In/Out msg nelems follow PyTorch (all_gather's
        output and reduce_scatter's input are `group.size` times larger). `metadata`: ``kernel``
        (args on the kernel, newer PyTorch), ``rpc`` (a ``record_param_comms`` op sharing the
        launch's External id), ``rpc_enclosing`` (the op encloses the launch, no id link) or
        ``none`` (nothing: the op comes from the kernel name only).
        """
        group = group or self.groups[0]
        coll_name, stem = _COLL_NAME[op]
        n_in = n_out = nelems
        if op == "all_gather":
            n_out = nelems * group.size
        elif op == "reduce_scatter":
            n_in = nelems * group.size
        meta = {
            "Collective name": coll_name,
            "In msg nelems": n_in,
            "Out msg nelems": n_out,
            "Group size": group.size,
            "dtype": dtype,
            "In split size": "[]",
            "Out split size": "[]",
            "Process Group Name": group.name,
            "Process Group Description": group.desc,
            "Process Group Ranks": "[" + ", ".join(str(r) for r in group.ranks) + "]",
        }
        name = kernel_name or f"ncclDevKernel_{stem}_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
        external: int | None = None
        if metadata in ("rpc", "rpc_enclosing") and launch_at is not None:
            rpc_id = self.cpu_op(
                "record_param_comms", launch_at - 2.0, launch_at + 3.0, launch_tid, **meta
            )
            external = rpc_id if metadata == "rpc" else None
        self._device_event(
            "kernel",
            name,
            start,
            dur,
            stream=stream,
            launch_at=launch_at,
            launch_tid=launch_tid,
            external_id=external,
            extra=meta if metadata == "kernel" else None,
        )
        size = max(n_in, n_out) * _DTYPE_BYTES[dtype]
        known = metadata != "none"
        self.truth.append(
            TruthEvent(
                "comm",
                start,
                start + dur,
                launch_at,
                op=op if known or op not in ("send", "recv", "all_to_all") else None,
                group=group if known else None,
                bytes=size if known else None,
            )
        )

    def coalesced_p2p(
        self,
        start: float,
        dur: float,
        *,
        ops: tuple[tuple[str, int, int], ...],
        group: Group,
        seq: int | None,
        launch_at: float,
        dtype: str = "Float",
        stream: int = 40,
        launch_tid: int = MAIN_TID,
    ) -> None:
        """One ``batch_isend_irecv`` batch on NCCL, the way PyTorch and NCCL write it.

        `ops`: ``(op, peer, nelems)`` per isend/irecv, ``op`` ``send`` or ``recv``, ``peer``
        the global rank. Where each shape comes from (see also core/trace/_coalesced.py):
        - per op, a ``record_param_comms`` operator with no launch inside (ProcessGroupNCCL's
          ``send``/``recv`` record it with ``RECORD_PARAM_COMMS_DATA``, then only queue the op
          in the NCCL group while coalescing). Its args are ``saveNcclMeta``'s
          (torch/csrc/profiler/util.cpp; key names in torch/csrc/profiler/util.h): ``Rank`` is
          the peer's rank in the group, ``Dst Rank`` / ``Src Rank`` its global rank, ``Seq``
          the batch's p2p sequence number (shared by its ops: ``seqP2P_`` is bumped once per
          coalesced batch; None leaves it out, as PyTorch before the flight recorder did);
          ``Process Group Name`` / ``Description`` are the group's ``pg_uid_`` / ``pg_desc_``
          (``"3"`` / ``"mesh_pp"`` for a DeviceMesh dim), written as JSON strings;
        - the ``nccl:coalesced`` user annotation (the profiling title ``endCoalescing`` gives
          the batch's work) around the launch;
        - one kernel for the batch, ``ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)``
          (NCCL >= 2.19 kernel names), with no collective args, launched by the CUDA driver's
          ``cuLaunchKernelEx`` (NCCL >= 2.19 launches through the driver API).
        The members sit in the 4 * len(ops) µs before `launch_at`; the annotation runs from
        1 µs before the launch to 5 µs after it.
        """
        opened = launch_at - 1.0
        first = opened - 4.0 * len(ops)
        size_of = _DTYPE_BYTES[dtype]
        strides = {b - a for a, b in zip(group.ranks, group.ranks[1:], strict=False)}
        stride = strides.pop() if len(strides) == 1 else None  # evenly strided: recorded
        sent: dict[str, int] = {}
        for i, (op, peer, nelems) in enumerate(ops):
            meta: dict[str, Any] = {
                "Collective name": op,
                "dtype": dtype,
                "In msg nelems": nelems,
                "Out msg nelems": nelems,
                "In split size": "[]",
                "Out split size": "[]",
                "Global rank start": group.ranks[0],
                "Group size": group.size,
                "Process Group Name": group.name,
                "Process Group Description": group.desc,
                "Process Group Ranks": "[" + ", ".join(str(r) for r in group.ranks) + "]",
                "Rank": group.ranks.index(peer),
                "Dst Rank" if op == "send" else "Src Rank": peer,
            }
            if seq is not None:
                meta["Seq"] = seq
            if stride is not None:
                meta["Global rank stride"] = stride
            at = first + 4.0 * i
            self.cpu_op("record_param_comms", at, at + 3.0, launch_tid, **meta)
            sent[op] = sent.get(op, 0) + nelems * size_of
        self.annotation("nccl:coalesced", opened, launch_at + 5.0, launch_tid)
        self._device_event(
            "kernel",
            "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
            start,
            dur,
            stream=stream,
            launch_at=launch_at,
            launch_tid=launch_tid,
            external_id=None,
            launch=("cuda_driver", "cuLaunchKernelEx"),
        )
        for op, size in sent.items():
            self.truth.append(
                TruthEvent("comm", start, start + dur, launch_at, op=op, group=group, bytes=size)
            )

    # --- CPU-only (gloo) ----------------------------------------------------------------------

    def gloo(
        self,
        op: str,
        start: float,
        dur: float,
        *,
        nelems: int = 1024,
        dtype: str = "Float",
        tid: int = GLOO_TIDS[0],
    ) -> None:
        """A gloo work item; the annotation carries the *input* tensor, as torch writes it."""
        self.events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"gloo:{op}",
                "pid": CPU_PID,
                "tid": tid,
                "ts": start,
                "dur": dur,
                "args": {
                    "External id": self._id(),
                    "Record function id": 0,
                    "Concrete Inputs": [""],
                    "Input type": [_GLOO_TYPE[dtype]],
                    "Input Strides": [[1]],
                    "Input Dims": [[nelems]],
                },
            }
        )
        factor = self.groups[0].size if op == "all_gather" else 1
        self.truth.append(
            TruthEvent(
                "comm",
                start,
                start + dur,
                None,
                op=op,
                group=self.groups[0],
                bytes=nelems * _DTYPE_BYTES[dtype] * factor,
            )
        )

    # --- output -------------------------------------------------------------------------------

    def build(self) -> dict[str, Any]:
        trace: dict[str, Any] = {
            "schemaVersion": 1,
            "deviceProperties": [{"id": DEVICE, "name": self.device_name, "numSms": 132}]
            if self.gpu
            else [],
            "distributedInfo": {
                "backend": "nccl" if self.gpu else "gloo",
                "rank": self.rank,
                "world_size": self.world_size,
                "pg_count": len(self.groups),
                "pg_config": [
                    {
                        "pg_name": g.name,
                        "pg_desc": g.desc,
                        "pg_size": g.size,
                        "ranks": list(g.ranks),
                    }
                    for g in self.groups
                ],
            },
            "traceEvents": [
                {
                    "ph": "M",
                    "name": "process_name",
                    "pid": CPU_PID,
                    "tid": 0,
                    "args": {"name": "python3"},
                },
                *self.events,
            ],
            "displayTimeUnit": "ms",
            "baseTimeNanoseconds": self.base_time_ns,
        }
        return trace


def realistic_trace(
    n_events: int, *, seed: int = 0, kernels_per_step: int = 2000
) -> tuple[dict[str, Any], int]:
    """A large GPU trace with the event mix of real DDP traces, for benchmarks.

    Per kernel: one CPU operator (with a nested one every other kernel), one launch, two flow
    events, some Python stack events; one NCCL all_reduce every 50 kernels on a second stream.
    Returns the trace and its exact event count (>= `n_events`).
    """
    rng = random.Random(seed)
    b = TraceBuilder(world_size=16, groups=(Group("0", "default_pg", tuple(range(16))),))
    t_cpu = 1_000.0
    t_gpu = 2_000.0
    step = 0
    while len(b.events) < n_events:
        step_start = t_cpu
        for k in range(kernels_per_step):
            op_start = t_cpu
            b.cpu_op("aten::linear", op_start, op_start + 6.0)
            if k % 2 == 0:
                b.cpu_op("aten::addmm", op_start + 1.0, op_start + 5.0)
                b.python_function("torch/nn/modules/linear.py(124): forward", op_start, t_cpu + 6)
            dur = rng.uniform(2.0, 20.0)
            t_gpu = max(t_gpu, op_start + 5.0) + rng.uniform(0.0, 2.0)
            b.kernel(t_gpu, dur, launch_at=op_start + 3.0)
            if k % 50 == 49:
                b.comm_kernel(
                    t_gpu + 1.0, 30.0, nelems=1 << 22, launch_at=op_start + 4.0, metadata="rpc"
                )
            t_gpu += dur
            t_cpu += 7.0
        b.profiler_step(step, step_start, t_cpu)
        step += 1
        t_cpu += 50.0
    trace = b.build()
    return trace, len(trace["traceEvents"])
