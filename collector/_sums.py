"""Job-level sums of the live ranks' latest figures, kept incrementally.

Each rank contributes a few ``(key, values)`` items (its MFU rates and peak, its latest breakdown,
its latest collectives, topology facts); a key is a `Kind` followed by that kind's labels. When
a rank's contribution changes, its old items are subtracted and the new ones added; when a rank
expires its items are subtracted. A key also counts its contributors and disappears with the last
one, so no float residue is left behind. A scrape then reads O(keys) numbers per job instead of
re-adding every rank's figures.

Float subtraction drifts by at most a few ulps per update; the owner rebuilds the sums exactly
from the live ranks every `REBUILD_EVERY` updates so the drift stays bounded over any run.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

__all__ = ["REBUILD_EVERY", "Contribution", "CountedSums", "Key", "Kind"]


class Kind:
    """What a contribution item is about: its labels after the kind -> its values.

    Plain `str` constants, not an enum: a tuple holding only strings and numbers is one the
    garbage collector stops tracking, and thousands of ranks hold tens of such keys each. With enum
    members (objects it must track) in them, every full collection walked ~150,000 key tuples at
    4,096 ranks and paused ingest for hundreds of milliseconds.
    """

    PEAK = "peak"  # () -> (peak FLOP/s,)
    PEAK_UNKNOWN = "peak_unknown"  # () -> (1,): a rank whose peak is unknown
    RATES = "rates"  # () -> (model FLOP/s, hardware FLOP/s, peak FLOP/s) over the rank's window
    WORLD_SIZE = "world_size"  # (world size,) -> (1,)
    TP_SPANS_HOSTS = "tp_spans_hosts"  # () -> (1,)
    TIER_PEAK = "tier_peak"  # (axis, tier, link peak bytes/s) -> (1,)
    TIER_SPEC_SOURCE = "tier_spec_source"  # (axis, tier, spec source) -> (1,)
    COMPONENT = "component"  # (component, axis, tier) -> (seconds,) of the latest breakdown
    OP = "op"  # (op, axis, tier) -> `CollectiveAcc.terms()` of the latest collectives
    TIER = "tier"  # (axis, tier) -> `CollectiveAcc.terms()` of the latest collectives


# e.g. (Kind.OP, "all_reduce", "dp", "inter_node"). Python 3.10 has no `Unpack` at run time.
if TYPE_CHECKING:
    from typing import Unpack

    Key = tuple[str, Unpack[tuple[str | float, ...]]]
else:
    Key = tuple
Contribution = tuple[tuple[Key, tuple[float, ...]], ...]
REBUILD_EVERY = 100_000


class CountedSums:
    """`sums[key]`: element-wise sum of the values contributed under `key`; `counts[key]`: how
    many contributions (ranks) that is."""

    __slots__ = ("counts", "sums", "updates")

    def __init__(self) -> None:
        self.sums: dict[Key, tuple[float, ...]] = {}
        self.counts: dict[Key, int] = {}
        self.updates = 0

    def replace(self, old: Contribution, new: Contribution) -> None:
        """Swap one rank's contribution `old` for `new` (either may be empty). Only keys whose
        values changed are touched: most of a rank's items stay the same from batch to batch."""
        if old == new:
            return
        self.updates += 1
        sums, counts = self.sums, self.counts
        previous = dict(old)
        for key, values in new:
            before = previous.pop(key, None)
            if before == values:
                continue
            total = sums.get(key)
            if total is None:
                sums[key] = values
                counts[key] = 1
            elif len(values) == 1:  # most items: one number, no generator needed
                sums[key] = (total[0] + values[0] - (0.0 if before is None else before[0]),)
                if before is None:
                    counts[key] += 1
            elif before is None:
                sums[key] = tuple(a + b for a, b in zip(total, values, strict=True))
                counts[key] += 1
            else:
                sums[key] = tuple(a + b - c for a, b, c in zip(total, values, before, strict=True))
        for key, values in previous.items():  # keys this rank no longer contributes to
            remaining = counts[key] - 1
            if remaining:
                counts[key] = remaining
                sums[key] = tuple(a - b for a, b in zip(sums[key], values, strict=True))
            else:
                del counts[key], sums[key]

    def rebuild(self, contributions: Iterable[Contribution]) -> None:
        """Recompute every sum exactly from the current contributions."""
        self.sums.clear()
        self.counts.clear()
        for contribution in contributions:
            self.replace((), contribution)
        self.updates = 0
