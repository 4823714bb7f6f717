"""`mfuscope calc`: back-of-envelope FLOPs, MFU/HFU and communication what-if, with `--json`.

Pure arithmetic over `mfuscope.core.trace` (no torch, no I/O beyond printing). See
docs/calc.md for the formulas and worked examples.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from mfuscope.cli._args import positive_quantity
from mfuscope.cli.calc._comm import comm_what_if
from mfuscope.cli.calc._render import render_text
from mfuscope.core.errors import CalcError
from mfuscope.core.flops import (
    CONVENTIONS,
    RECOMPUTE_MODES,
    TransformerShape,
    count_params,
    transformer_flops_per_token,
)
from mfuscope.core.hardware import DTYPES, resolve_peak
from mfuscope.core.mfu import hfu, mfu

__all__ = ["CalcError", "add_arguments", "compute", "run"]


_number = positive_quantity  # a float > 0, with an optional k/M/G(B)/T/P suffix


def _count(text: str) -> int:
    value = _number(text)
    if value != int(value):
        raise argparse.ArgumentTypeError(f"must be a whole number: {text!r}")
    return int(value)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("model")
    model.add_argument("--params", type=_number, help="total parameters N (e.g. 70B)")
    model.add_argument("--active-params", type=_number, help="active parameters per token (MoE)")
    for flag, text in (
        ("--layers", "transformer layers L"),
        ("--hidden", "hidden size h"),
        ("--ffn-hidden", "feed-forward size F (default 4h)"),
        ("--heads", "query heads H"),
        ("--kv-heads", "key/value heads K (GQA; default H)"),
        ("--head-dim", "head dimension Q (default h/H)"),
        ("--vocab", "vocabulary size V"),
        ("--experts", "MoE experts E"),
        ("--experts-per-token", "MoE experts per token k"),
        ("--seq-len", "sequence length T (tokens)"),
    ):
        model.add_argument(flag, type=_count, help=text)
    model.add_argument("--gated-mlp", action="store_true", help="SwiGLU-style MLP (3 matrices)")
    model.add_argument("--tied-embeddings", action="store_true", help="input = output embedding")
    model.add_argument(
        "--recompute",
        choices=RECOMPUTE_MODES,
        default="none",
        help="activation recomputation: selective (attention) or full (the whole forward); "
        "its FLOPs count for HFU, not MFU (default none)",
    )
    model.add_argument(
        "--convention",
        choices=CONVENTIONS,
        default="palm",
        help="FLOPs per token: palm, 6N + attention (default); megatron, the GEMMs counted "
        "from the shape (Narayanan et al. 2021)",
    )
    model.add_argument("--no-attention", action="store_true", help="drop the 12*L*H*Q*T term")

    work = parser.add_argument_group("work and time")
    batch = work.add_mutually_exclusive_group()
    batch.add_argument("--global-batch", type=_count, help="sequences per step (whole job)")
    batch.add_argument("--tokens-per-step", type=_number, help="tokens per step (whole job)")
    timing = work.add_mutually_exclusive_group()
    timing.add_argument("--step-time", type=_number, help="seconds per step")
    timing.add_argument("--tokens-per-s", type=_number, help="job throughput, tokens/s")
    work.add_argument("--devices", type=_count, help="accelerators in the job (default tp*pp*dp)")
    work.add_argument("--device", help="device name for the peak table (e.g. h100-sxm)")
    work.add_argument("--dtype", default="bf16", help=f"training dtype: {', '.join(DTYPES)}")
    work.add_argument("--peak-flops", type=_number, help="dense peak FLOP/s per device")

    comm = parser.add_argument_group("communication what-if")
    for flag, text in (
        ("--tp", "tensor-parallel degree"),
        ("--pp", "pipeline-parallel degree (stages)"),
        ("--dp", "data-parallel degree (default: devices / (tp * pp))"),
        ("--ep", "expert-parallel degree (MoE; must divide --dp)"),
        ("--microbatches", "micro-batches per step per pipeline (default 1)"),
    ):
        comm.add_argument(flag, type=_count, help=text)
    comm.add_argument(
        "--gpus-per-node",
        type=_count,
        default=8,
        help="devices per node: groups within one node use the intra-node link (default 8)",
    )
    comm.add_argument("--fsdp", action="store_true", help="DP axis shards parameters (ZeRO-3)")
    comm.add_argument(
        "--sequence-parallel",
        action="store_true",
        help="TP with sequence parallelism: reduce-scatter + all-gather instead of all-reduce",
    )
    comm.add_argument("--intra-bw", type=_number, help="intra-node bytes/s (unidirectional)")
    comm.add_argument("--inter-bw", type=_number, help="inter-node bytes/s (unidirectional)")
    comm.add_argument("--intra-alpha", type=float, help="intra-node latency, s")
    comm.add_argument("--inter-alpha", type=float, help="inter-node latency, s")
    comm.add_argument("--grad-bytes", type=_count, help="bytes per gradient element")
    comm.add_argument("--act-bytes", type=_count, help="bytes per activation element")
    comm.add_argument(
        "--compute-efficiency",
        type=_number,
        default=1.0,
        help="share of peak the compute runs at, for the overlap window (default 1.0: shortest)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


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


def compute(args: argparse.Namespace) -> dict[str, Any]:
    """Every figure `mfuscope calc` prints, as a JSON-ready dict (None where not computable)."""
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


def run(args: argparse.Namespace) -> int:
    try:
        result = compute(args)
    except CalcError as exc:
        print(f"mfuscope calc: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=2, allow_nan=False))
    else:
        print(render_text(result))
    if result["peak_source"] == "unknown" and (args.step_time or args.tokens_per_s):
        print(f"mfuscope calc: note: {result['peak_message']}", file=sys.stderr)
    return 0
