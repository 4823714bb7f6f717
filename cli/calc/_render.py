"""Plain-text rendering of `mfuscope calc` results (the JSON form is the dict itself)."""

from __future__ import annotations

from typing import Any

__all__ = ["render_text"]

_PREFIXES = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def _si(value: float | None, unit: str = "") -> str:
    if value is None:
        return "unknown"
    for scale, prefix in _PREFIXES:
        if abs(value) >= scale:
            return f"{value / scale:.4g} {prefix}{unit}"
    return f"{value:.4g} {unit}".rstrip()


def _ratio(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.4f} ({value * 100:.1f}%)"


def _seconds(value: float | None) -> str:
    if value is None:
        return "unknown"
    if value < 1e-3:
        return f"{value * 1e6:.4g} us"
    if value < 1:
        return f"{value * 1e3:.4g} ms"
    return f"{value:.4g} s"


def _comm_lines(comm: dict[str, Any]) -> list[str]:
    layout = comm["layout"]
    lines = [
        "",
        "communication what-if (per rank, per step)",
        "  layout: tp={tp} pp={pp} dp={dp} ep={ep}, {gpus_per_node} GPUs/node".format(**layout)
        + (", fsdp" if layout["fsdp"] else "")
        + (", sequence-parallel" if layout["sequence_parallel"] else ""),
    ]
    for tier, link in comm["links"].items():
        lines.append(
            f"  {tier}: {link['name']} ({link['source']}), "
            f"{_si(link['beta_bytes_per_s'], 'B/s')} per direction, "
            f"alpha {_seconds(link['alpha_s'])}"
        )
    lines.append(f"  micro-batch: {comm['micro_batch_size']:g} sequences")
    lines.append(f"  compute per device (overlap budget): {_seconds(comm['compute_s'])}")
    lines.append(f"  pipeline bubble (p-1)/(m+p-1): {_ratio(comm['pipeline_bubble_fraction'])}")
    if not comm["axes"]:
        lines.append("  no communicating axis (every degree is 1)")
    for a in comm["axes"]:
        hide = {True: "can hide", False: "exposed", None: "unknown (no peak)"}[a["hideable"]]
        if a["hideable"] and not a["overlapped_by_default"]:
            # TP / EP collectives block the compute that needs their result unless the
            # framework overlaps them (e.g. Megatron-LM's --tp-comm-overlap).
            hide += " only if the framework overlaps it (exposed by default)"
        lines.append(
            f"  {a['axis']:<3} {a['op']:<15} {a['tier']:<10} n={a['group_size']:<5} "
            f"{a['calls_per_step']} x {_si(a['bytes_per_call'], 'B')} = "
            f"{_seconds(a['seconds_per_step'])} "
            f"(window {_seconds(a['overlap_window_s'])}): {hide}"
        )
    return lines


def render_text(result: dict[str, Any]) -> str:
    """Human-readable summary of a `calc.compute` result."""
    lines = [
        f"convention: {result['convention']}, recompute: {result['recompute']}",
        f"parameters used for FLOPs: {_si(result['params_used'])}",
    ]
    if result["params_counted"] is not None:
        lines.append(f"parameters counted from the shape: {_si(result['params_counted'])}")
    lines += [
        f"model FLOPs per token: {_si(result['model_flops_per_token'], 'FLOP')}",
        f"recompute FLOPs per token: {_si(result['recompute_flops_per_token'], 'FLOP')}",
        f"tokens per step: {_si(result['tokens_per_step'])}",
        f"model FLOPs per step: {_si(result['model_flops_per_step'], 'FLOP')}",
        f"hardware FLOPs per step: {_si(result['hardware_flops_per_step'], 'FLOP')}",
        f"step time: {_seconds(result['step_time_s'])}",
        f"devices: {result['devices']}",
        f"peak: {_si(result['peak_flops'], 'FLOP/s')} [{result['peak_source']}] "
        f"{result['peak_message']}",
        f"achieved model FLOP/s per device: {_si(result['achieved_flops_per_device'], 'FLOP/s')}",
        f"MFU: {_ratio(result['mfu'])}",
        f"HFU: {_ratio(result['hfu'])}",
    ]
    if result["comm"] is not None:
        lines += _comm_lines(result["comm"])
    return "\n".join(lines)
