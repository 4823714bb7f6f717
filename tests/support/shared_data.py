"""The real traces and Grafana schemas that lie beside the checkout, in ``../shared``.

CI puts that folder there; a lone clone of the repository does not have it. Every test that reads
it goes through `require` (or the `*_params` helpers), so without it those tests are skipped with
one reason, `MISSING_REASON`, instead of failing with "no such file". CI sets
``MFUSCOPE_REQUIRE_SHARED=1``, which turns the skip into a failure: there, a missing folder is a
broken set-up, not a lone clone.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "A100_TRACE",
    "GRAFANA_SCHEMAS",
    "MI300X_TRACE",
    "MISSING_REASON",
    "REQUIRE_ENV",
    "SHARED",
    "TRACES",
    "real_trace_params",
    "require",
]

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"
TRACES = SHARED / "traces"
A100_TRACE = TRACES / "hta_resnet_ddp_2xA100" / "nccl_data.json.gz"
MI300X_TRACE = TRACES / "tracelens_resnet_actckpt_8xMI300X" / "resnet_act_checkpoint.json.gz"
GRAFANA_SCHEMAS = SHARED / "grafana-schema"

REQUIRE_ENV = "MFUSCOPE_REQUIRE_SHARED"
MISSING_REASON = (
    f"needs the real traces and schemas in {SHARED} beside the checkout, which CI provides "
    "and a lone clone lacks"
)


def _required() -> bool:
    return os.environ.get(REQUIRE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def require(path: Path) -> Path:
    """`path` (under `SHARED`) when it exists; otherwise skip the calling test with
    `MISSING_REASON` (or fail it, under ``MFUSCOPE_REQUIRE_SHARED=1``)."""
    if path.exists():
        return path
    if _required():
        pytest.fail(f"{path} is missing and {REQUIRE_ENV} is set: {MISSING_REASON}")
    pytest.skip(MISSING_REASON)


def real_trace_params(paths: Iterable[Path] | None = None) -> list[Any]:
    """`pytest.param`s for parametrizing over real traces (default: every ``*.json.gz`` under
    `TRACES`), with the trace's folder as the id. Without `SHARED` this is one param marked to
    skip with `MISSING_REASON` (an empty list's skip would not say why). Tests still call
    `require` on the path, which fails them under ``MFUSCOPE_REQUIRE_SHARED=1``."""
    if SHARED.exists():
        found = sorted(TRACES.glob("*/*.json.gz")) if paths is None else list(paths)
        return [pytest.param(p, id=p.parent.name) for p in found]
    marks = [] if _required() else [pytest.mark.skip(reason=MISSING_REASON)]
    return [pytest.param(TRACES / "missing", id="shared-missing", marks=marks)]
