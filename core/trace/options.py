"""One way to build the engine's `AnalysisOptions`, link models included, for the live agent,
`mfuscope analyze` and `mfuscope report --traces` alike, so the three split the same trace the
same way.

The link models feed the pipeline-bubble rule (see docs/definitions.md): an exposed pipeline
send/recv counts as communication up to its ideal alpha-beta time on its tier and as pipeline
bubble beyond it. Which links: detected hardware first (the agent's NVML/sysfs facts), then the
device's reference-design defaults (`hardware.link_for_tier`). A CPU trace or rank with nothing
detected has no link model at all: its exposed pipeline p2p is all bubble, since no link rate
describes a gloo transfer.
"""

from __future__ import annotations

from collections.abc import Mapping

from mfuscope.core.bandwidth import LinkModel
from mfuscope.core.hardware import (
    LINK_TIER_KEYS,
    PeakLookup,
    default_link_tiers,
    find_device,
    link_for_tier,
    resolve_peak,
)
from mfuscope.core.interconnects import DetectedLinks
from mfuscope.core.trace._events import KinetoTrace
from mfuscope.core.trace.result import AnalysisOptions
from msgspec.structs import replace

__all__ = [
    "analysis_options",
    "link_models",
    "options_for_trace",
    "trace_device",
    "trace_tier_specs",
]


def link_models(
    device: str | None, detected: DetectedLinks | None = None
) -> dict[str, LinkModel] | None:
    """Tier -> alpha-beta model of the link one device uses on it (beta: unidirectional bytes/s).

    `device` is the GPU's model name (None: a CPU); `detected` what hardware detection found.
    A tier neither describes is absent; None when no tier is described.
    """
    if device is None and detected is None:
        return None
    found = {tier: link_for_tier(tier, device, detected) for tier in LINK_TIER_KEYS}
    models = {tier: link.link_model() for tier, link in found.items() if link is not None}
    return models or None


def analysis_options(
    *,
    device: str | None,
    detected: DetectedLinks | None = None,
    gpus_per_node: int | None = None,
    host_of_rank: Mapping[int, str] | None = None,
    axis_overrides: Mapping[str, str] | None = None,
    model_flops_per_step: float | None = None,
    recompute_flops_per_step: float | None = None,
    peak_flops: float | None = None,
    window_annotation: str | None = None,
    window_range_us: tuple[float, float] | None = None,
    gloo_worker_groups: Mapping[int, str] | None = None,
) -> AnalysisOptions:
    """The engine's options for one rank on `device` (see `link_models` for the links).
    `window_annotation` / `window_range_us` choose the windows of a trace without
    ``ProfilerStep#N`` (docs/analyze.md); by default each step, else the whole trace."""
    return AnalysisOptions(
        gpus_per_node=gpus_per_node,
        host_of_rank=host_of_rank or None,
        axis_overrides=dict(axis_overrides or {}),
        model_flops_per_step=model_flops_per_step,
        recompute_flops_per_step=recompute_flops_per_step,
        peak_flops=peak_flops,
        links=link_models(device, detected),
        window_annotation=window_annotation,
        window_range_us=window_range_us,
        gloo_worker_groups=dict(gloo_worker_groups) if gloo_worker_groups else None,
    )


def trace_device(trace: KinetoTrace) -> str | None:
    """The device model of a GPU trace when all its devices share one name; None otherwise (a CPU
    trace has no device properties)."""
    names = {
        p.get("name")
        for p in trace.device_properties or ()
        if isinstance(p, dict) and isinstance(p.get("name"), str)
    }
    return names.pop() if len(names) == 1 else None


def options_for_trace(
    trace: KinetoTrace, base: AnalysisOptions, dtype: str
) -> tuple[AnalysisOptions, PeakLookup]:
    """`base` with the link models of the device `trace` was recorded on (offline: no detection,
    so the device's defaults) and MFU against `base.peak_flops` if set, else that device's
    datasheet peak for `dtype`; and where that peak came from (`hardware.resolve_peak`)."""
    device = trace_device(trace)
    peak = resolve_peak(device, dtype, base.peak_flops)
    return replace(base, links=link_models(device), peak_flops=peak.peak_flops), peak


def trace_tier_specs(device: str | None) -> dict[str, float]:
    """Tier -> the spec rate (unidirectional bytes/s) a trace's collectives compare with.

    A trace does not say which links its machine had: inside a node, the datasheet link of a
    known GPU (`hardware.default_link_tiers`). Across nodes there is none: the spec depends on
    how many of a group's ranks share a node and the NICs they drive
    (docs/definitions.md#link-specs), which a trace does not say; nor for a CPU or an unknown
    device.
    """
    if device is None or find_device(device) is None:
        return {}
    tiers = default_link_tiers(device)
    intra = tiers.get("intra_node")
    return {} if intra is None else {"intra_node": intra.unidirectional_bytes_per_s}
