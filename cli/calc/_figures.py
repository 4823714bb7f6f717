"""Every figure `mfuscope calc` prints, from its parsed options (pure arithmetic over `core`)."""

from __future__ import annotations

import argparse
from typing import Any

from mfuscope.cli.calc._comm import comm_what_if
from mfuscope.cli.calc._options import with_dtype
from mfuscope.core.errors import CalcError
from mfuscope.core.flops import TransformerShape, count_params, transformer_flops_per_token
from mfuscope.core.hardware import PeakLookup, resolve_peak
from mfuscope.core.mfu import hfu, mfu

__all__ = ["compute"]


def _shape(args: argparse.Namespace) -> TransformerShape | None:
    if args.layers is None and args.hidden is None:
        return None
    if args.layers is None or args.hidden is None:
        raise CalcError("the shape needs both --layers and --hidden")
    return TransformerShape(
        layers=args.layers,
        hidden=args.hidden,
        heads=args.heads,
        kv_heads=args.kv_heads,
        head_dim=args.head_dim,
        ffn_hidden=args.ffn_hidden,
        gated_mlp=args.gated_mlp,
        vocab=args.vocab or 0,
        tied_embeddings=args.tied_embeddings,
        experts=args.experts or 1,
        experts_per_token=args.experts_per_token or 1,
    )


def compute(args: argparse.Namespace, cpu_peak: PeakLookup | None = None) -> dict[str, Any]:
    """Every figure `mfuscope calc` prints, as a JSON-ready dict (None where not computable).
    `cpu_peak`: this machine's calibrated CPU peak (`--device cpu`), used unless `--peak-flops`
    is given."""
    args = with_dtype(args)
    try:
        shape = _shape(args)
    except ValueError as exc:
        raise CalcError(str(exc)) from None
    params = args.active_params or args.params
    seq_len = args.seq_len
    if seq_len is None:
        if shape is not None and not args.no_attention:
            raise CalcError("the attention term needs --seq-len (or pass --no-attention)")
        seq_len = 1
    try:
        token = transformer_flops_per_token(
            shape,
            seq_len=seq_len,
            params=params,
            recompute=args.recompute,
            convention=args.convention,
            include_attention=not args.no_attention,
        )
    except ValueError as exc:
        raise CalcError(str(exc)) from None
    comm_requested = any(getattr(args, k) is not None for k in ("tp", "pp", "dp", "ep"))
    if not 0 < args.compute_efficiency <= 1:
        raise CalcError(f"--compute-efficiency must be in (0, 1], got {args.compute_efficiency}")
    layout_size = (args.tp or 1) * (args.pp or 1) * (args.dp or 1)
    devices = args.devices or (layout_size if comm_requested else 1)
    tokens_per_step = args.tokens_per_step
    if args.global_batch is not None:
        if args.seq_len is None:
            raise CalcError("--global-batch needs --seq-len")
        tokens_per_step = float(args.global_batch * args.seq_len)
    step_time = args.step_time
    if step_time is None and args.tokens_per_s is not None and tokens_per_step is not None:
        step_time = tokens_per_step / args.tokens_per_s
    tokens_per_s = args.tokens_per_s
    if tokens_per_s is None and step_time is not None and tokens_per_step is not None:
        tokens_per_s = tokens_per_step / step_time
    if cpu_peak is not None and args.peak_flops is None:
        peak = cpu_peak
    else:
        peak = resolve_peak(args.device, args.dtype, args.peak_flops)
    out: dict[str, Any] = {
        "convention": args.convention,
        "recompute": args.recompute,
        "params": args.params,
        "params_used": token.params_used,
        "params_counted": count_params(shape).total if shape is not None else None,
        "model_flops_per_token": token.model,
        "recompute_flops_per_token": token.recompute,
        "hardware_flops_per_token": token.hardware,
        "tokens_per_step": tokens_per_step,
        "model_flops_per_step": token.model * tokens_per_step if tokens_per_step else None,
        "hardware_flops_per_step": token.hardware * tokens_per_step if tokens_per_step else None,
        "step_time_s": step_time,
        "tokens_per_s": tokens_per_s,
        "devices": devices,
        "peak_flops": peak.peak_flops,
        "peak_source": peak.source,
        "peak_message": peak.message,
        "mfu": None,
        "hfu": None,
        "achieved_flops_per_device": None,
        "comm": None,
    }
    if tokens_per_s is not None:
        model_per_device_s = token.model * tokens_per_s / devices  # FLOPs in one second
        out["achieved_flops_per_device"] = model_per_device_s
        if peak.peak_flops is not None:
            out["mfu"] = mfu(model_per_device_s, peak.peak_flops, 1.0)
            recompute_per_device_s = token.recompute * tokens_per_s / devices
            out["hfu"] = hfu(model_per_device_s, recompute_per_device_s, peak.peak_flops, 1.0)
    if comm_requested:
        # DP/FSDP traffic moves every parameter (all experts), not just the active ones.
        try:
            out["comm"] = comm_what_if(
                args, shape, args.params or out["params_counted"], out, devices
            )
        except ValueError as exc:
            raise CalcError(str(exc)) from None
    return out
