"""`mfuscope calc`'s options: the model, the work and time, and the communication layout."""

from __future__ import annotations

import argparse

from mfuscope.cli._args import positive_quantity
from mfuscope.core.flops import CONVENTIONS, RECOMPUTE_MODES
from mfuscope.core.hardware import DTYPES

__all__ = ["add_arguments", "is_cpu", "with_dtype"]

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
    work.add_argument(
        "--device",
        help="device name for the peak table (e.g. h100-sxm); cpu: this machine's calibrated "
        "CPU peak, the agent's (measured once and cached; imports torch)",
    )
    work.add_argument(
        "--dtype",
        default=None,
        help=f"training dtype: {', '.join(DTYPES)} (default bf16; fp32 with --device cpu)",
    )
    work.add_argument("--peak-flops", type=_number, help="dense peak FLOP/s per device")
    work.add_argument(
        "--calibrate",
        action="store_true",
        help="measure this machine's CPU peak again (every cached figure: other thread counts "
        "and dtypes too) and use it; implies --device cpu; without a model, only calibrates",
    )

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


def is_cpu(device: str | None) -> bool:
    """Whether `--device` names this machine's CPU."""
    return device is not None and device.strip().lower() == "cpu"


def with_dtype(args: argparse.Namespace) -> argparse.Namespace:
    """`args` with the training dtype resolved: `--dtype`, else fp32 for this machine's CPU
    (`--device cpu`, `--calibrate`: the agent's default there), else bf16 (a copy)."""
    if getattr(args, "dtype", None) is not None:
        return args
    cpu = getattr(args, "calibrate", False) or is_cpu(getattr(args, "device", None))
    return argparse.Namespace(**{**vars(args), "dtype": "fp32" if cpu else "bf16"})
