"""Link tiers: the unidirectional peak rate and default latency of every interconnect we model.

Unidirectional is the comparison figure everywhere (nccl-tests busbw is compared with it, see
`bandwidth.py`); vendors usually quote the bidirectional ("duplex") figure, twice as large.

Rates are in bytes/s (1 GB/s = 1e9 bytes/s; network rates in Gb/s are divided by 8). Latencies
(`alpha_s`) are defaults for the alpha-beta model (`time = alpha + bytes / beta`); the report's
per-tier fit (docs/definitions.md#alpha-beta-fit) measures the observed values, so these only need
to be the right order of magnitude. Sources, by family:

- NVLink: per link 25 GB/s per direction for generations 2, 3 and 4 (4 lanes x 6.25 GB/s), 20 GB/s
  for NVLink 1, 50 GB/s for NVLink 5. 6 / 12 / 18 links per V100 / A100 / H100 (SXM) GPU give 150
  / 300 / 450 GB/s unidirectional (300 / 600 / 900 GB/s bidirectional). Source: the ml-engineering
  book, "Networking" chapter, NVLink table; hwloc issue #574 (per-link rate of v3/v4).
  NVLink 5 (Blackwell): 18 links, 1.8 TB/s bidirectional per GPU (NVIDIA GB200 NVL72 / HGX B200
  datasheets), so 900 GB/s per direction.
- AMD xGMI (Infinity Fabric): MI250X 7 x 50 GB/s = 350 GB/s, MI300X 7 x 64 GB/s = 448 GB/s per
  direction (source: ml-engineering "Networking", Infinity Fabric table).
- PCIe x16 per direction: Gen3 15.75, Gen4 31.5, Gen5 63, Gen6 121, Gen7 242 GB/s (PCI-SIG
  transfer rates after 128b/130b or FLIT encoding; source: ml-engineering PCIe table, 31 / 63 /
  121 / 242 GB/s).
- InfiniBand, one 4X port per direction: EDR 100, HDR 200, NDR 400, XDR 800 Gb/s (IBTA signalling
  rates; source: ml-engineering InfiniBand table, "4 links" row).
- Ethernet / RoCE: the port speed per direction (100/200/400/800 GbE).

Default latencies: NVLink ~1 us and InfiniBand ~2 us (source: "The Memory Hierarchy of a Cluster",
alpha-beta table; source: "Interconnect - the bandwidth pyramid", ~2 us RDMA). PCIe 2 us is our
assumption (about twice NVLink; NCCL's own tuning model, src/graph/tuning.cc hwLat, puts PCI ring
latency at ~1.7x NVLink's). RoCE 3 us: IB plus the "slight overhead" of Ethernet framing the
ml-engineering book describes (assumption). Plain TCP Ethernet 10 us: the low end of that book's
"~10-50 us" for 100G Ethernet.
"""

from __future__ import annotations

import msgspec
from mfuscope.core.bandwidth import LinkModel

__all__ = [
    "LINK_KINDS",
    "LINK_TIERS",
    "NVLINK_PER_LINK_BYTES_PER_S",
    "PCIE_PER_LANE_BYTES_PER_S",
    "DetectedLinks",
    "LinkTier",
    "detected_inter_node_link",
    "detected_intra_node_link",
    "link_tier",
]

LINK_KINDS: tuple[str, ...] = ("nvlink", "xgmi", "pcie", "infiniband", "roce", "ethernet")

NVLINK_ALPHA_S = 1e-6
XGMI_ALPHA_S = 1e-6  # same class of point-to-point GPU fabric as NVLink (assumption)
PCIE_ALPHA_S = 2e-6
INFINIBAND_ALPHA_S = 2e-6
ROCE_ALPHA_S = 3e-6
ETHERNET_ALPHA_S = 10e-6

# NVLink generation -> bytes/s per link per direction (see module docstring).
NVLINK_PER_LINK_BYTES_PER_S: dict[int, float] = {1: 20e9, 2: 25e9, 3: 25e9, 4: 25e9, 5: 50e9}

# PCIe generation -> bytes/s per lane per direction, so that x16 gives the table above.
PCIE_PER_LANE_BYTES_PER_S: dict[int, float] = {
    1: 0.25e9,  # 2.5 GT/s, 8b/10b
    2: 0.5e9,  # 5 GT/s, 8b/10b
    3: 15.75e9 / 16,  # 8 GT/s, 128b/130b
    4: 31.5e9 / 16,  # 16 GT/s, 128b/130b
    5: 63e9 / 16,  # 32 GT/s, 128b/130b
    6: 121e9 / 16,  # 64 GT/s PAM4, FLIT
    7: 242e9 / 16,  # 128 GT/s PAM4, FLIT
}

_NIC_PREFIX: dict[str, str] = {"infiniband": "ib", "roce": "roce", "ethernet": "eth"}
_ALPHA_BY_KIND: dict[str, float] = {
    "nvlink": NVLINK_ALPHA_S,
    "xgmi": XGMI_ALPHA_S,
    "pcie": PCIE_ALPHA_S,
    "infiniband": INFINIBAND_ALPHA_S,
    "roce": ROCE_ALPHA_S,
    "ethernet": ETHERNET_ALPHA_S,
}


class LinkTier(msgspec.Struct, frozen=True):
    """One interconnect: its unidirectional peak (bytes/s) and default latency (s)."""

    name: str
    kind: str
    unidirectional_bytes_per_s: float
    alpha_s: float
    source: str

    def __post_init__(self) -> None:
        if self.kind not in LINK_KINDS:
            raise ValueError(f"unknown link kind {self.kind!r}; expected one of {LINK_KINDS}")
        if not self.unidirectional_bytes_per_s > 0:
            raise ValueError(f"{self.name}: bandwidth must be > 0")
        if not self.alpha_s >= 0:
            raise ValueError(f"{self.name}: alpha_s must be >= 0")

    def link_model(self) -> LinkModel:
        """The alpha-beta model of this tier (beta = unidirectional rate)."""
        return LinkModel(alpha_s=self.alpha_s, beta_bytes_per_s=self.unidirectional_bytes_per_s)


def _tier(name: str, kind: str, bytes_per_s: float, source: str) -> LinkTier:
    return LinkTier(name, kind, bytes_per_s, _ALPHA_BY_KIND[kind], source)


def _nvlink(generation: int, links: int, source: str) -> LinkTier:
    rate = NVLINK_PER_LINK_BYTES_PER_S[generation] * links
    return _tier(f"nvlink{generation}", "nvlink", rate, source)


_TIERS: list[LinkTier] = [
    _nvlink(2, 6, "V100 SXM2: 6 NVLink2 links x 25 GB/s"),
    _nvlink(3, 12, "A100 SXM4: 12 NVLink3 links x 25 GB/s"),
    _nvlink(4, 18, "H100/H200 SXM: 18 NVLink4 links x 25 GB/s"),
    _nvlink(5, 18, "B200/GB200: 18 NVLink5 links x 50 GB/s (1.8 TB/s bidirectional)"),
    _tier(
        "nvlink4-bridge",
        "nvlink",
        12 * 25e9,
        "H100/H200 NVL pair bridge: 600 GB/s bidirectional (NVIDIA H100 NVL datasheet)",
    ),
    _tier(
        "nvlink4-h800",
        "nvlink",
        8 * 25e9,
        "H800: NVLink cut to 400 GB/s bidirectional (NVIDIA H800 datasheet), 8 NVLink4 links",
    ),
    _tier("xgmi-mi250x", "xgmi", 350e9, "MI250X Infinity Fabric: 7 x 50 GB/s"),
    _tier("xgmi-mi300x", "xgmi", 448e9, "MI300X Infinity Fabric: 7 x 64 GB/s"),
    _tier(
        "xgmi-mi325x",
        "xgmi",
        448e9,
        "MI325X Infinity Fabric: 7 links x 128 GB/s bidirectional (AMD MI325X datasheet)",
    ),
    *(
        _tier(
            f"pcie{gen}-x16",
            "pcie",
            PCIE_PER_LANE_BYTES_PER_S[gen] * 16,
            f"PCIe Gen{gen} x16, per direction",
        )
        for gen in (3, 4, 5, 6, 7)
    ),
    *(
        _tier(f"ib-{rate_name}", "infiniband", gbps * 1e9 / 8, f"InfiniBand 4X {rate_name.upper()}")
        for rate_name, gbps in (("edr", 100), ("hdr", 200), ("ndr", 400), ("xdr", 800))
    ),
    *(
        _tier(f"roce-{gbps}g", "roce", gbps * 1e9 / 8, f"RoCE v2 over {gbps} GbE")
        for gbps in (100, 200, 400, 800)
    ),
    *(
        _tier(f"eth-{gbps}g", "ethernet", gbps * 1e9 / 8, f"{gbps} GbE (TCP, no RDMA)")
        for gbps in (10, 25, 100, 200, 400)
    ),
]

LINK_TIERS: dict[str, LinkTier] = {t.name: t for t in _TIERS}


def link_tier(name: str) -> LinkTier:
    """The tabulated tier called `name` (e.g. ``"nvlink4"``, ``"pcie5-x16"``, ``"ib-ndr"``)."""
    try:
        return LINK_TIERS[name]
    except KeyError:
        known = ", ".join(sorted(LINK_TIERS))
        raise ValueError(f"unknown link tier {name!r}; known tiers: {known}") from None


class DetectedLinks(msgspec.Struct, frozen=True):
    """What detection (`mfuscope.agent.detect`) found for one local GPU; plain data.

    `nvlink_generation` is the NVLink generation (1..5), already mapped from NVML's version enum.
    `nic_rates_bits_per_s` holds the rate of each active NIC port (per direction, bits/s) and
    `nic_kind` is ``"infiniband"``, ``"roce"`` or ``"ethernet"``.
    """

    nvlink_generation: int | None = None
    nvlink_links_up: int = 0
    pcie_generation: int | None = None
    pcie_width: int | None = None
    nic_rates_bits_per_s: tuple[float, ...] = ()
    nic_kind: str | None = None


def detected_intra_node_link(links: DetectedLinks) -> LinkTier | None:
    """The intra-node link the detected hardware gives one GPU, or None if nothing usable.

    NVLink wins when links are up and the generation's per-link rate is known: the GPU's
    unidirectional NVLink bandwidth is then links_up x per-link rate (through NVSwitch every peer
    is reachable at that rate). Otherwise the PCIe link: generation x width.
    """
    per_link = NVLINK_PER_LINK_BYTES_PER_S.get(links.nvlink_generation or 0)
    if links.nvlink_links_up > 0 and per_link is not None:
        return LinkTier(
            name=f"nvlink{links.nvlink_generation}",
            kind="nvlink",
            unidirectional_bytes_per_s=per_link * links.nvlink_links_up,
            alpha_s=NVLINK_ALPHA_S,
            source=(
                f"detected: {links.nvlink_links_up} NVLink{links.nvlink_generation} links up x "
                f"{per_link / 1e9:g} GB/s"
            ),
        )
    per_lane = PCIE_PER_LANE_BYTES_PER_S.get(links.pcie_generation or 0)
    if per_lane is not None and links.pcie_width:
        return LinkTier(
            name=f"pcie{links.pcie_generation}-x{links.pcie_width}",
            kind="pcie",
            unidirectional_bytes_per_s=per_lane * links.pcie_width,
            alpha_s=PCIE_ALPHA_S,
            source=f"detected: PCIe Gen{links.pcie_generation} x{links.pcie_width}",
        )
    return None


def detected_inter_node_link(links: DetectedLinks) -> LinkTier | None:
    """The inter-node link from the detected NIC ports, or None if none is active.

    One NIC port per GPU is assumed (rail-optimised clusters, docs/definitions.md#tiers), so the
    tier is the fastest active port, not the sum of the node's ports.
    """
    rates = [r for r in links.nic_rates_bits_per_s if r > 0]
    if not rates:
        return None
    kind = links.nic_kind or "ethernet"
    if kind not in _NIC_PREFIX:
        kind = "ethernet"
    fastest = max(rates)
    prefix = _NIC_PREFIX[kind]
    return LinkTier(
        name=f"{prefix}-{fastest / 1e9:g}g",
        kind=kind,
        unidirectional_bytes_per_s=fastest / 8,
        alpha_s=_ALPHA_BY_KIND[kind],
        source=f"detected: fastest active {kind} port {fastest / 1e9:g} Gb/s",
    )
