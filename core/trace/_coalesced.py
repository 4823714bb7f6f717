"""Batched point-to-point on NCCL: one kernel for the several send/recv of a batch.

What PyTorch writes for ``torch.distributed.batch_isend_irecv`` on NCCL (the batched p2p of
``torch.distributed.pipelining`` schedules such as 1F1B), read from ``ProcessGroupNCCL.cpp``:

- the batch runs between ``startCoalescing`` (``ncclGroupStart``) and ``endCoalescing``;
- each isend/irecv records a ``record_param_comms`` operator (``Collective name`` ``send`` /
  ``recv``, ``In msg nelems``, ``dtype``, ``Process Group Name`` / ``Description`` /
  ``Ranks``, ``Dst Rank`` / ``Src Rank``, and a ``Seq`` that every op of one batch shares) but
  launches nothing: NCCL only queues the op inside the group;
- ``endCoalescing`` opens the batch's work, whose profiling title is the user annotation
  ``nccl:coalesced``, and ends the NCCL group: that launches *one* kernel for the whole batch
  (``ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)`` on NCCL >= 2.19). The launch
  lies inside the annotation and outside every ``record_param_comms``, so the kernel carries
  no collective args of its own.

So a communication kernel whose launch falls inside a ``nccl:coalesced`` annotation takes its
metadata from the batch's members: the ``record_param_comms`` send/recv on the launching thread
after that thread's previous communication launch and before the annotation, all of one group
(and of one ``Seq`` where the trace gives it). How the batch is counted is in
docs/analyze.md ("Collectives").
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from mfuscope.core.trace._collectives import normalise_op
from mfuscope.core.trace._events import EventArgs
from mfuscope.core.trace._scan import Event
from mfuscope.core.vocabulary import P2P_OPS

__all__ = ["COALESCED_ANNOTATION", "CoalescedBatches"]

# ProcessGroupNCCL's profiling title for the work of a coalesced batch (`endCoalescing`).
COALESCED_ANNOTATION = "nccl:coalesced"


def _end(event: Event) -> float:
    return float(event.ts) + float(event.dur or 0.0)


class CoalescedBatches:
    """The member ``record_param_comms`` of the coalesced batch a kernel launch belongs to."""

    def __init__(
        self,
        annotations: Iterable[Event],
        operators_by_thread: Mapping[Any, Sequence[Event]],
        operator_starts: Mapping[Any, Sequence[float]],
        comm_launches: Iterable[Event | None],
    ) -> None:
        """`operators_by_thread`: each thread's ``record_param_comms`` sorted by start, and
        `operator_starts` their start times; `comm_launches`: the host launches of the rank's
        communication kernels."""
        by_thread: dict[Any, list[Event]] = defaultdict(list)
        for event in annotations:
            if event.name == COALESCED_ANNOTATION:
                by_thread[event.tid].append(event)
        self._annotations = {
            tid: sorted(events, key=lambda e: float(e.ts)) for tid, events in by_thread.items()
        }
        self._annotation_starts = {
            tid: [float(e.ts) for e in events] for tid, events in self._annotations.items()
        }
        launches: dict[Any, list[float]] = defaultdict(list)
        for launch in comm_launches:
            if launch is not None and launch.tid in self._annotations:
                launches[launch.tid].append(float(launch.ts))
        self._launches = {tid: sorted(times) for tid, times in launches.items()}
        self._operators = operators_by_thread
        self._operator_starts = operator_starts

    def _annotation(self, launch: Event) -> Event | None:
        starts = self._annotation_starts.get(launch.tid)
        if not starts:
            return None
        t = float(launch.ts)
        i = bisect.bisect_right(starts, t) - 1
        if i < 0:
            return None
        annotation = self._annotations[launch.tid][i]
        return annotation if t <= _end(annotation) else None

    def members(self, launch: Event | None) -> tuple[EventArgs, ...]:
        """The args of the send/recv in the batch `launch` ends, in time order; empty when the
        launch is no coalesced batch's (or its members are not in the trace)."""
        if launch is None:
            return ()
        annotation = self._annotation(launch)
        if annotation is None:
            return ()
        tid, opened = launch.tid, float(annotation.ts)
        launches = self._launches.get(tid, [])
        # The previous communication launch on this thread ended the previous batch or
        # standalone op: the members come after it.
        j = bisect.bisect_left(launches, opened) - 1
        after = launches[j] if j >= 0 else float("-inf")
        operators = self._operators.get(tid, ())
        starts = self._operator_starts.get(tid, ())
        i = bisect.bisect_left(starts, opened) - 1
        members: list[EventArgs] = []
        first: EventArgs | None = None
        while i >= 0 and starts[i] > after:
            args = operators[i].args
            i -= 1
            if args is None or normalise_op(str(args.collective_name or "")) not in P2P_OPS:
                break
            if first is None:
                first = args
            elif args.pg_name != first.pg_name or (
                args.seq is not None and first.seq is not None and args.seq != first.seq
            ):
                break
            members.append(args)
        return tuple(reversed(members))
