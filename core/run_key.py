"""The run key: which runs of training are the same workload, for the live baseline across runs
(docs/compare.md, "A live baseline across runs").

By default the key fingerprints what fixes a run's expected MFU: the model FLOPs per step, the
world size, the parallel layout (each axis and its group size), the device and the training
dtype. Two runs with the same key are expected to reach the same MFU; a new image, torch, NCCL
or node pool does not change the key, which is the point: those are what a baseline across runs
catches. A user's key (``MFUSCOPE_RUN_KEY``, or the agent's ``run_key`` option) replaces the
fingerprint, e.g. to keep one baseline across a deliberate change of the FLOPs count.

Pure: the caller passes every fact in.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable

__all__ = ["RUN_KEY_MAX_CHARS", "check_run_key", "fingerprint"]

RUN_KEY_MAX_CHARS = 128
# FLOPs per step to this many significant digits: a recount on another input shape moves the
# count by far less, a changed model by far more.
_FLOPS_DIGITS = 4
_PREFIX = "fp-"


def check_run_key(text: str) -> str:
    """A user's run key as given, if it can be a Prometheus label value everyone can read:
    1 to `RUN_KEY_MAX_CHARS` printable characters. Raises ValueError saying what is wrong."""
    if not isinstance(text, str) or not text or len(text) > RUN_KEY_MAX_CHARS:
        raise ValueError(f"a run key is 1 to {RUN_KEY_MAX_CHARS} characters, got {text!r}")
    if not text.isprintable():
        raise ValueError(f"a run key holds only printable characters, got {text!r}")
    return text


def fingerprint(
    model_flops_per_step: float,
    world_size: int,
    layout: Iterable[tuple[str, int]],
    device: str,
    dtype: str,
) -> str:
    """``fp-`` and 16 hex digits of SHA-256 over the canonical text of the facts: FLOPs per step
    per rank (to 4 significant digits), world size, the sorted distinct ``(axis, group size)``
    pairs of the layout, the device name and the dtype (lower-cased). Raises ValueError for a
    negative or non-finite FLOPs count or a world size below 1."""
    if not (math.isfinite(model_flops_per_step) and model_flops_per_step >= 0):
        raise ValueError(
            f"model FLOPs per step must be finite and >= 0, got {model_flops_per_step}"
        )
    if world_size < 1:
        raise ValueError(f"world size must be >= 1, got {world_size}")
    axes = ",".join(f"{axis}={size}" for axis, size in sorted(set(layout)))
    text = "|".join(
        (
            f"flops={model_flops_per_step:.{_FLOPS_DIGITS - 1}e}",
            f"world={world_size}",
            f"layout={axes}",
            f"device={device.strip()}",
            f"dtype={dtype.strip().lower()}",
        )
    )
    return _PREFIX + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
