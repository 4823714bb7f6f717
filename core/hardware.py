"""Peak FLOP/s lookup and default link tiers per device: pure data in, plain results out.

MFU is only as honest as its denominator. The rules this module enforces:

- the peak is the *dense* tensor-core peak for the training dtype (never the sparsity figure, never
  the TF32 peak for a BF16 run);
- an unknown device is an explicit ``source="unknown"`` result whose message says how to pass the
  peak; there is no fallback to another GPU's figure (the classic failure: an unknown GPU silently
  treated as an A100, reporting 88% MFU where 12% was true);
- a CPU peak is never tabulated: it is measured (`mfuscope.agent.calibrate`) and labelled so.

The table with its vendor sources lives in `_device_table.py`; link tiers in `links.py`.
"""

from __future__ import annotations

import re

import msgspec
from mfuscope.core._device_table import DEVICES, DeviceSpec
from mfuscope.core.bandwidth import LinkModel
from mfuscope.core.interconnects import (
    DetectedLinks,
    LinkTier,
    detected_inter_node_link,
    detected_intra_node_link,
    link_tier,
)
from mfuscope.core.mig import is_mig_name, mig_slice
from mfuscope.core.vocabulary import PEAK_SOURCES

__all__ = [
    "DTYPES",
    "LINK_TIER_KEYS",
    "DeviceSpec",
    "PeakLookup",
    "default_link_models",
    "default_link_tiers",
    "find_device",
    "known_devices",
    "link_for_tier",
    "lookup_memory_bandwidth",
    "lookup_peak",
    "normalize_dtype",
    "resolve_peak",
    "tier_peak_bytes_per_s",
    "user_peak",
]

DTYPES: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8")
LINK_TIER_KEYS: tuple[str, ...] = ("intra_node", "inter_node")

_DTYPE_ALIASES: dict[str, str] = {
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "f32": "fp32",
    "tf32": "tf32",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "f16": "fp16",
    "fp8": "fp8",
    "float8": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "e4m3": "fp8",
    "e5m2": "fp8",
}
_CPU_NAMES = frozenset({"cpu", "host"})
_VENDOR_TOKENS = frozenset({"nvidia", "amd", "instinct", "tesla"})


class PeakLookup(msgspec.Struct, frozen=True):
    """A peak FLOP/s figure and where it came from.

    `peak_flops` is dense FLOP/s per device, or None when `source` is ``"unknown"``; `source` is
    one of `PEAK_SOURCES`; `device_key` names the table row (``"h100-sxm"``, ``"cpu"``) or is None
    for an unrecognised device; `message` is a one-line explanation fit for a user.
    """

    peak_flops: float | None
    source: str
    device_key: str | None
    message: str

    def __post_init__(self) -> None:
        if self.source not in PEAK_SOURCES:
            raise ValueError(f"source must be one of {PEAK_SOURCES}, got {self.source!r}")
        if (self.peak_flops is None) != (self.source == "unknown"):
            raise ValueError("peak_flops is None exactly when source is 'unknown'")
        if self.peak_flops is not None and not self.peak_flops > 0:
            raise ValueError(f"peak_flops must be > 0, got {self.peak_flops}")


def normalize_dtype(dtype: str) -> str:
    """Map a dtype spelling (``"bfloat16"``, ``"torch.float16"``, ``"tf32"``) onto `DTYPES`."""
    text = dtype.strip().lower().removeprefix("torch.")
    try:
        return _DTYPE_ALIASES[text]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {DTYPES}") from None


def _tokens(name: str) -> list[str]:
    return [t for t in re.split(r"[^a-z0-9]+", name.lower()) if t]


def known_devices() -> tuple[str, ...]:
    """Keys of every tabulated device, in table order."""
    return tuple(d.key for d in DEVICES)


def _matches(spec: DeviceSpec, tokens: set[str]) -> bool:
    if any(t in tokens for t in spec.exclude):
        return False
    return all(any(t in tokens for t in group) for group in spec.match)


def find_device(name: str) -> DeviceSpec | None:
    """The table row for a device name (NVML / torch / trace spelling, or a table key)."""
    tokens = _tokens(name)
    short = "-".join(t for t in tokens if t not in _VENDOR_TOKENS)
    for spec in DEVICES:
        if short == spec.key or short in spec.aliases:
            return spec
    token_set = set(tokens)
    for spec in DEVICES:
        if _matches(spec, token_set):
            return spec
    return None


# Parts matched by name but left out of the table on purpose: no vendor datasheet gives their
# peaks, and mfuscope takes peaks from datasheets only.
_NO_DATASHEET: dict[str, str] = {
    "h20": "NVIDIA publishes no datasheet for the H20 (its figures circulate only second-hand)",
}


def _unknown_message(name: str, dtype: str) -> str:
    token_set = set(_tokens(name))
    hint = "pass the dense per-device peak with --peak-flops (agent option: peak_flops=...)"
    for token, why in _NO_DATASHEET.items():
        if token in token_set:
            return f"device {name!r}: {why}; MFU is not computed; {hint}"
    candidates = [d for d in DEVICES if any(t in token_set for t in d.family)]
    if candidates:
        options = ", ".join(
            f"{d.key} ({(d.peak(dtype) or 0) / 1e12:g} TFLOP/s)" for d in candidates
        )
        return (
            f"device {name!r} is ambiguous: its {dtype} peak differs between {options}; "
            f"name the variant (e.g. --device {candidates[0].key}) or {hint}"
        )
    return (
        f"unknown device {name!r}: mfuscope has no dense {dtype} peak for it and will not guess "
        f"one, so MFU is not computed; {hint}. Known devices: {', '.join(known_devices())}"
    )


def lookup_peak(device: str, dtype: str, *, mig: bool = False) -> PeakLookup:
    """Dense peak FLOP/s of one `device` for training in `dtype`, from the vendor table.

    Returns ``source="spec"`` with the figure, or ``source="unknown"`` (peak None) with a message
    saying how to pass the peak. A MIG slice (its name carries the profile, or `mig` says NVML
    reports MIG mode) gets the whole GPU's peak x its compute share (`mfuscope.core.mig`), or
    unknown when its profile cannot be read. Raises ValueError only for a dtype spelling it cannot
    read.
    """
    whole = _lookup_whole_device_peak(device, dtype)
    if whole.peak_flops is None or not (mig or is_mig_name(device)):
        return whole
    part = mig_slice(device)
    if part is None:
        return PeakLookup(
            None,
            "unknown",
            whole.device_key,
            f"{device!r} is a MIG slice of unknown profile: its share of the GPU's peak is not "
            "known, so MFU is not computed; pass --peak-flops (agent option: peak_flops=...)",
        )
    return PeakLookup(
        whole.peak_flops * part.compute_share,
        "spec",
        whole.device_key,
        f"MIG {part.profile}: {part.compute_slices}/7 of {whole.message}",
    )


def lookup_memory_bandwidth(device: str, *, mig: bool = False) -> float | None:
    """Datasheet device-memory bandwidth of `device` in bytes/s (a MIG slice's share of it),
    None when unknown."""
    spec = find_device(device)
    if spec is None or spec.memory_bytes_per_s is None:
        return None
    if not (mig or is_mig_name(device)):
        return spec.memory_bytes_per_s
    part = mig_slice(device)
    share = part.memory_share if part is not None else None
    return spec.memory_bytes_per_s * share if share is not None else None


def _lookup_whole_device_peak(device: str, dtype: str) -> PeakLookup:
    kind = normalize_dtype(dtype)
    if device.strip().lower() in _CPU_NAMES:
        return PeakLookup(
            None,
            "unknown",
            "cpu",
            "CPU peaks are not tabulated: measure one with "
            "mfuscope.agent.calibrate.measure_cpu_peak_flops() (labelled 'measured') or pass "
            "--peak-flops",
        )
    spec = find_device(device)
    if spec is None:
        return PeakLookup(None, "unknown", None, _unknown_message(device, kind))
    peak = spec.peak(kind)
    if peak is None:
        return PeakLookup(
            None,
            "unknown",
            spec.key,
            f"{spec.display_name} has no {kind} tensor-core mode in its datasheet; "
            f"pass --peak-flops if you know the rate your kernels run at",
        )
    return PeakLookup(
        peak,
        "spec",
        spec.key,
        f"{spec.display_name}: dense {kind} peak {peak / 1e12:g} TFLOP/s ({spec.source})",
    )


def user_peak(peak_flops: float, device: str | None = None) -> PeakLookup:
    """A peak the user passed (``--peak-flops``): dense FLOP/s per device, taken as given."""
    if not peak_flops > 0:
        raise ValueError(f"peak_flops must be > 0 FLOP/s, got {peak_flops}")
    spec = find_device(device) if device else None
    return PeakLookup(
        float(peak_flops),
        "user",
        spec.key if spec else None,
        f"user-supplied peak {peak_flops / 1e12:g} TFLOP/s per device",
    )


def resolve_peak(
    device: str | None, dtype: str, peak_flops: float | None = None, *, mig: bool = False
) -> PeakLookup:
    """Precedence: a user-supplied `peak_flops` > the spec table (MIG-scaled) > unknown."""
    if peak_flops is not None:
        return user_peak(peak_flops, device)
    if device is None:
        return PeakLookup(
            None, "unknown", None, "no device and no --peak-flops given: MFU is not computed"
        )
    return lookup_peak(device, dtype, mig=mig)


def default_link_tiers(device: str | None) -> dict[str, LinkTier]:
    """Datasheet link tiers for `device`, keyed ``"intra_node"`` / ``"inter_node"``; a tier the
    datasheets do not give is absent.

    Known GPU: its native intra-node fabric (NVLink generation / xGMI / the card's PCIe interface)
    and, for parts sold in a vendor reference system whose datasheet names the NICs (DGX A100: HDR
    200G; DGX H100/H200/B200, GB200: NDR 400G), that NIC per GPU. PCIe cards and parts without
    such a system have no inter-node default. Unknown device or CPU: no tier at all (an explicit
    unknown, docs/definitions.md#link-specs). Detection (`link_for_tier` with `DetectedLinks`)
    overrides these when it finds real links.
    """
    spec = find_device(device) if device else None
    if spec is None:
        return {}
    names = {"intra_node": spec.intra_link, "inter_node": spec.inter_link}
    return {tier: link_tier(name) for tier, name in names.items() if name is not None}


def default_link_models(device: str | None) -> dict[str, LinkModel]:
    """`default_link_tiers` as alpha-beta models (beta = unidirectional bytes/s)."""
    return {tier: t.link_model() for tier, t in default_link_tiers(device).items()}


def link_for_tier(
    tier: str, device: str | None = None, links: DetectedLinks | None = None
) -> LinkTier | None:
    """The link one GPU uses on `tier`: detected hardware first, then the device's datasheet
    defaults; None when neither knows (never a guessed figure)."""
    if tier not in LINK_TIER_KEYS:
        raise ValueError(f"tier must be one of {LINK_TIER_KEYS}, got {tier!r}")
    if links is not None:
        found = (
            detected_intra_node_link(links)
            if tier == "intra_node"
            else detected_inter_node_link(links)
        )
        if found is not None:
            return found
    return default_link_tiers(device).get(tier)


def tier_peak_bytes_per_s(
    tier: str, device: str | None = None, links: DetectedLinks | None = None
) -> float | None:
    """Unidirectional peak bytes/s of `tier` for one GPU (what nccl-tests busbw compares to);
    None when unknown."""
    found = link_for_tier(tier, device, links)
    return found.unidirectional_bytes_per_s if found is not None else None
