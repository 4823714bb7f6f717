"""Whether a trace without device events is of an accelerator job all the same.

A trace whose device events were lost (the profiler ran without the CUDA activity, the
device events were filtered out, or they are of a kind the analysis does not read) would
otherwise be read as a CPU-only (gloo) job, silently. What says otherwise:
- device events of a category the analysis does not read (``_scan.UNREAD_DEVICE_CATEGORIES``):
  there is a device timeline but not one we understand, so no answer (`TraceError`);
- ``nccl:*`` collectives (the ProcessGroupNCCL record_function names) or
  ``record_param_comms`` of an NCCL job, ``distributedInfo.backend`` ``nccl``, devices in
  ``deviceProperties``: a GPU job whose kernels are missing. The host timeline still says
  something (operators, collectives on the host), so the answer comes with a warning naming
  what is missing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from mfuscope.core.errors import TraceError
from mfuscope.core.trace._events import KinetoTrace
from mfuscope.core.trace._scan import KERNEL_CATEGORIES, MEMOP_CATEGORIES, ScannedEvents

__all__ = ["missing_device_timeline"]

_NCCL_PREFIX = "nccl:"
_READ = ", ".join((*KERNEL_CATEGORIES, *MEMOP_CATEGORIES))


def _counted(counter: Counter[str], limit: int = 3) -> str:
    return ", ".join(f"{name} x{n}" for name, n in counter.most_common(limit))


def _gpu_job_signs(trace: KinetoTrace, scanned: ScannedEvents) -> list[str]:
    signs: list[str] = []
    nccl = Counter(
        e.name for e in (*scanned.annotations, *scanned.cpu_ops) if e.name.startswith(_NCCL_PREFIX)
    )
    if nccl:
        signs.append(_counted(nccl))
    info = trace.distributed_info
    if isinstance(info, Mapping) and info.get("backend") == "nccl":
        signs.append("distributedInfo.backend nccl")
    devices = [p for p in trace.device_properties or () if isinstance(p, dict)]
    if devices:
        name = devices[0].get("name")
        signs.append(f"{len(devices)} device(s) in deviceProperties ({name})")
    return signs


def missing_device_timeline(trace: KinetoTrace, scanned: ScannedEvents) -> str | None:
    """For a trace without readable device events: None if it is a CPU-only job, else the
    warning to give with its host-timeline answer. Raises `TraceError` when its device events
    are of a kind not read, or when it has no host activity either."""
    unread = Counter(e.cat or "" for e in scanned.unread_device)
    if unread:
        raise TraceError(
            None,
            f"device events of a kind mfuscope does not read ({_counted(unread)}); "
            f"it reads device timelines in categories {_READ}",
        )
    signs = _gpu_job_signs(trace, scanned)
    if not signs:
        return None
    if not scanned.cpu_ops and not scanned.annotations:
        raise TraceError(
            None, f"no device timeline: no events in categories {_READ} ({'; '.join(signs)})"
        )
    return (
        f"no device events (categories {_READ}) in a trace of a GPU job ({'; '.join(signs)}): "
        "the answer is of the host timeline (CPU operators), not of the device"
    )
