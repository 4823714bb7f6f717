"""The communication what-if part of `mfuscope calc`: flags -> `comm_model` -> a JSON-ready dict."""

from __future__ import annotations

import argparse
from typing import Any

from mfuscope.core.bandwidth import LinkModel
from mfuscope.core.comm_model import (
    ACTIVATION_INPUTS,
    OVERLAPPED_BY_DEFAULT,
    CommWhatIf,
    ParallelLayout,
    StepWork,
    backward_share,
    estimate_step_comm,
)
from mfuscope.core.errors import CalcError
from mfuscope.core.flops import TransformerShape, count_params
from mfuscope.core.hardware import LINK_TIER_KEYS, default_link_tiers, normalize_dtype

__all__ = ["comm_what_if"]


def _links(args: argparse.Namespace, device: str | None) -> dict[str, dict[str, Any]]:
    """Tier -> the link used for it: the user's --intra-bw / --inter-bw, else the device's
    datasheet link; a tier neither gives is left out (no invented rate)."""
    out: dict[str, dict[str, Any]] = {}
    tabled_tiers = default_link_tiers(device)
    for tier in LINK_TIER_KEYS:
        tabled = tabled_tiers.get(tier)
        prefix = "intra" if tier == "intra_node" else "inter"
        bw = getattr(args, f"{prefix}_bw")
        alpha = getattr(args, f"{prefix}_alpha")
        if bw is not None:
            default_alpha = tabled.alpha_s if tabled is not None else 0.0
            out[tier] = {
                "name": "user",
                "source": "user",
                "beta_bytes_per_s": bw,
                "alpha_s": alpha if alpha is not None else default_alpha,
            }
        elif tabled is not None:
            out[tier] = {
                "name": tabled.name,
                "source": "datasheet",
                "beta_bytes_per_s": tabled.unidirectional_bytes_per_s,
                "alpha_s": alpha if alpha is not None else tabled.alpha_s,
            }
    return out


# The flag that gives each activation input (StepWork field -> calc flags).
_FLAGS = {
    "layers": "--layers",
    "hidden": "--hidden",
    "seq_len": "--seq-len",
    "global_batch": "--global-batch",
}


def _listed(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _check_activation_inputs(
    args: argparse.Namespace, layout: ParallelLayout, work: StepWork
) -> None:
    """Name exactly the flags the TP/PP/EP traffic still needs (core says which inputs)."""
    axes = [f"--{a} {d}" for a, d in (("tp", layout.tp), ("pp", layout.pp)) if d > 1]
    if layout.ep > 1 and work.moe_layers > 0:
        axes.append(f"--ep {layout.ep}")
    missing = [_FLAGS[name] for name in ACTIVATION_INPUTS if getattr(work, name) < 1]
    if not axes or not missing:
        return
    given = [_FLAGS[name] for name in ACTIVATION_INPUTS if getattr(work, name) >= 1]
    why = ""
    if args.global_batch is None and args.tokens_per_step is not None:
        why = " (--tokens-per-step does not say how it splits into sequences)"
    raise CalcError(
        f"the traffic of {_listed(axes)} is sized by the activations, which need "
        f"{_listed(missing)}{why}" + (f"; given: {', '.join(given)}" if given else "")
    )


def comm_what_if(
    args: argparse.Namespace,
    shape: TransformerShape | None,
    params: float | None,
    flops: dict[str, Any],
    devices: int,
) -> dict[str, Any]:
    """Per-axis bytes and time per step for the layout in `args` (see docs/calc.md)."""
    if params is None:
        raise CalcError("the communication what-if needs --params (or a shape with --vocab)")
    tp, pp, ep = args.tp or 1, args.pp or 1, args.ep or 1
    dp = args.dp or max(1, devices // (tp * pp))
    layout = ParallelLayout(tp, pp, dp, ep, args.gpus_per_node, args.fsdp, args.sequence_parallel)
    if layout.world_size != devices:
        raise CalcError(f"tp*pp*dp = {layout.world_size} but --devices is {devices}")
    dtype = normalize_dtype(args.dtype)
    wide = 4 if dtype in ("fp32", "tf32") else 2
    moe = shape is not None and shape.experts > 1
    expert_params = 0.0
    if shape is not None and moe:
        expert_params = float(shape.layers * shape.experts * count_params(shape).mlp_per_expert)
    work = StepWork(
        params=params,
        layers=shape.layers if shape else 0,
        hidden=shape.hidden if shape else 0,
        seq_len=args.seq_len or 0,
        global_batch=args.global_batch or 0,
        microbatches=args.microbatches or 1,
        expert_params=min(expert_params, params),
        moe_layers=shape.layers if shape is not None and moe else 0,
        experts_per_token=shape.experts_per_token if shape else 1,
        activation_bytes=args.act_bytes or wide,
        grad_bytes=args.grad_bytes or wide,
        param_bytes=wide,
        recompute=args.recompute,
    )
    _check_activation_inputs(args, layout, work)
    links = _links(args, args.device)
    models = {t: LinkModel(v["alpha_s"], v["beta_bytes_per_s"]) for t, v in links.items()}
    peak = flops["peak_flops"]
    per_token = flops["hardware_flops_per_token"]
    tokens = flops["tokens_per_step"]
    compute_s = 0.0
    if peak and tokens:
        compute_s = per_token * tokens / devices / (peak * args.compute_efficiency)
    share = backward_share(flops["model_flops_per_token"], flops["recompute_flops_per_token"])
    try:
        what_if = estimate_step_comm(work, layout, models, compute_s, share)
    except KeyError as exc:
        flag = "--intra-bw" if exc.args and exc.args[0] == "intra_node" else "--inter-bw"
        raise CalcError(
            f"no link spec for the {exc.args[0] if exc.args else 'a'} tier: the device has no "
            f"datasheet link there (or is not given); pass {flag}"
        ) from None
    return _comm_dict(what_if, layout, links, known_compute=bool(peak and tokens))


def _comm_dict(
    what_if: CommWhatIf, layout: ParallelLayout, links: dict[str, Any], known_compute: bool
) -> dict[str, Any]:
    return {
        "layout": {
            "tp": layout.tp,
            "pp": layout.pp,
            "dp": layout.dp,
            "ep": layout.ep,
            "gpus_per_node": layout.gpus_per_node,
            "fsdp": layout.fsdp,
            "sequence_parallel": layout.sequence_parallel,
        },
        "links": links,
        "micro_batch_size": what_if.micro_batch_size,
        "compute_s": what_if.compute_s if known_compute else None,
        "pipeline_bubble_fraction": what_if.pipeline_bubble_fraction,
        "axes": [
            {
                "axis": a.axis,
                "op": a.op,
                "tier": a.tier,
                "group_size": a.group_size,
                "calls_per_step": a.calls_per_step,
                "bytes_per_call": a.bytes_per_call,
                "bytes_per_step": a.bytes_per_step,
                "bus_bytes_per_step": a.bus_bytes_per_step,
                "seconds_per_step": a.seconds_per_step,
                "overlap_window_s": a.overlap_window_s if known_compute else None,
                "hideable": a.hideable if known_compute else None,
                "overlapped_by_default": a.axis in OVERLAPPED_BY_DEFAULT,
            }
            for a in what_if.axes
        ],
    }
