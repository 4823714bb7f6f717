"""The process group of a gloo send/recv, which the trace does not name.

What torch 2.13 writes for an isend/irecv on gloo (checked on traces of real
`torch.distributed.pipelining` runs, GPipe and 1F1B on a 2 x 2 ("dp", "pp") mesh): a
``gloo:send`` / ``gloo:recv`` user annotation on the calling thread, from the call until
``wait()`` returns, with the tensor's ``Input Dims`` / ``Input type``; it starts inside the
enqueueing ``c10d::send`` / ``c10d::recv_`` operator, whose ``Concrete Inputs`` hold the peer as
its rank *in the group*, but no group. A group-local peer cannot tell groups apart (every group
of two ranks or more has a rank 1), so the group is chosen from the rank's groups in
``distributedInfo.pg_config`` (the groups it belongs to):

- one multi-rank group: that one (the rule of gloo collectives, `_gloo`);
- several, of which exactly one is on the pipeline axis (``pp`` after the axis rules of
  `TopologyView.axis`): that one. Point-to-point traffic of a job with one pipeline group is
  taken as the pipeline's; a job that also sends point-to-point on another group over gloo
  would see that traffic counted as pipeline traffic;
- otherwise the rule of gloo collectives (axis ``unknown``; the size only when all the groups
  share it).
"""

from __future__ import annotations

from mfuscope.core.trace._collectives import AttributedGroup, ProcessGroups, TopologyView
from mfuscope.core.vocabulary import PIPELINE_AXIS

__all__ = ["pipeline_p2p_group"]


def pipeline_p2p_group(groups: ProcessGroups, view: TopologyView) -> AttributedGroup | None:
    """The pipeline group of a rank with several multi-rank groups of which exactly one is on
    the ``pp`` axis; None when that rule does not decide (see the module docstring)."""
    candidates = groups.multi_rank_groups()
    if len(candidates) < 2:
        return None
    pipeline = [g for g in candidates if view.axis(g) == PIPELINE_AXIS]
    if len(pipeline) != 1:
        return None
    (group,) = pipeline
    return AttributedGroup.of(group, view, "the pipeline group")
