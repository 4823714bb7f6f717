"""`mfuscope calc` end to end: the seeds' and papers' figures through the command line."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from typing import Any

import pytest
from mfuscope.cli import calc, main
from mfuscope.cli.calc._options import _number


def argv(text: str) -> list[str]:
    return shlex.split(text)


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, Any, str]:
    parser = argparse.ArgumentParser()
    calc.add_arguments(parser)
    code = calc.run(parser.parse_args([*argv, "--json"]))
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else None), err


# ml-engineering "Networking" seed: 2B params, seqlen 2048, global batch 16, 8 x A100,
# recomputation on, 0.42 s per iteration (50% of 312 TFLOP/s), fp32 gradients.
SEED_2B = argv(
    "--params 2B --seq-len 2048 --global-batch 16 --devices 8 --device a100 --recompute full "
    "--step-time 0.42 --dp 8 --grad-bytes 4 --compute-efficiency 0.5"
)


def test_seed_2b_example(capsys: pytest.CaptureFixture[str]) -> None:
    code, result, _ = _run(SEED_2B, capsys)
    assert code == 0
    assert result["hardware_flops_per_step"] / 8 == pytest.approx(65.536e12)
    assert result["model_flops_per_step"] / 8 == pytest.approx(49.152e12)
    assert result["peak_source"] == "spec"
    assert result["hfu"] == pytest.approx(0.5, rel=1e-3)
    assert result["mfu"] == pytest.approx(0.375, rel=1e-3)
    assert result["achieved_flops_per_device"] == pytest.approx(49.152e12 / 0.42)
    (dp,) = result["comm"]["axes"]
    assert (dp["axis"], dp["op"], dp["tier"], dp["group_size"]) == (
        "dp",
        "all_reduce",
        "intra_node",
        8,
    )
    assert dp["bytes_per_call"] == 8e9
    assert dp["seconds_per_step"] == pytest.approx(1.75 * 8e9 / 300e9 + 1e-6)
    assert dp["hideable"] is True
    assert result["comm"]["compute_s"] == pytest.approx(0.42, rel=1e-3)


def test_palm_mfu(capsys: pytest.CaptureFixture[str]) -> None:
    # PaLM 540B (Chowdhery et al. 2022): 238.3K tokens/s on 6144 TPU v4 (275 TFLOP/s): 46.2%.
    args = argv(
        "--params 540.35B --layers 118 --hidden 18432 --heads 48 --head-dim 256 --seq-len 2048 "
        "--tokens-per-s 238.3e3 --devices 6144 --peak-flops 275T"
    )
    code, result, _ = _run(args, capsys)
    assert code == 0
    assert result["peak_source"] == "user"
    assert round(result["mfu"] * 100, 1) == 46.2
    assert result["hfu"] == result["mfu"]


def test_unknown_device_is_explicit(capsys: pytest.CaptureFixture[str]) -> None:
    args = argv("--params 7B --seq-len 4096 --tokens-per-s 1e5 --devices 8 --device H100")
    code, result, err = _run(args, capsys)
    assert code == 0
    assert result["peak_source"] == "unknown"
    assert result["peak_flops"] is None
    assert result["mfu"] is None and result["hfu"] is None
    assert result["achieved_flops_per_device"] == pytest.approx(42e9 * 1e5 / 8)
    assert "--peak-flops" in err


def test_peak_flops_overrides_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    args = argv("--params 7B --tokens-per-s 1e5 --device h100-sxm --peak-flops 500T")
    _, result, _ = _run(args, capsys)
    assert result["peak_flops"] == 500e12
    assert result["mfu"] == pytest.approx(42e9 * 1e5 / 500e12)


def test_pipeline_what_if(capsys: pytest.CaptureFixture[str]) -> None:
    args = argv(
        "--params 70B --layers 80 --hidden 8192 --heads 64 --kv-heads 8 --ffn-hidden 28672 "
        "--gated-mlp --vocab 128256 --seq-len 4096 --global-batch 1024 --device h100-sxm "
        "--tp 8 --pp 4 --dp 32 --microbatches 8 --step-time 12 --recompute selective"
    )
    code, result, _ = _run(args, capsys)
    assert code == 0
    comm = result["comm"]
    assert comm["pipeline_bubble_fraction"] == pytest.approx(3 / 11)
    assert comm["micro_batch_size"] == 4
    axes = {(a["axis"], a["op"]): a for a in comm["axes"]}
    assert axes["tp", "all_reduce"]["tier"] == "intra_node"
    assert axes["tp", "all_reduce"]["calls_per_step"] == 8 * 20 * 4
    assert axes["pp", "send"]["tier"] == "inter_node"
    assert axes["dp", "all_reduce"]["bytes_per_call"] == pytest.approx(70e9 / 32 * 2)
    assert comm["links"]["intra_node"]["name"] == "nvlink4"
    assert result["devices"] == 1024


def test_user_bandwidths(capsys: pytest.CaptureFixture[str]) -> None:
    # Seed "Interconnect - the bandwidth pyramid": 80 layers, TP 8, ~50 MB all-reduces on a
    # 900 GB/s fabric: 320 per step, ~32 ms.
    args = argv(
        "--params 70B --layers 80 --hidden 8192 --seq-len 3052 --global-batch 1 --tp 8 "
        "--intra-bw 900e9 --intra-alpha 0 --peak-flops 989.4T --step-time 1"
    )
    _, result, _ = _run(args, capsys)
    (tp,) = result["comm"]["axes"]
    assert tp["calls_per_step"] == 320
    assert tp["seconds_per_step"] == pytest.approx(32e-3, rel=0.05)
    assert result["comm"]["links"]["intra_node"]["name"] == "user"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (argv("--layers 2 --seq-len 8"), "--hidden"),
        (argv("--layers 2 --hidden 64 --heads 4"), "--seq-len"),
        (argv("--params 1B --devices 8 --tp 2 --dp 2"), "--devices"),
        (argv("--params 1B --recompute selective"), "shape"),
        (argv("--params 1B --seq-len 8 --global-batch 3 --layers 2 --hidden 64 --tp 2 --dp 2"),
         "divisible"),
        (argv("--params 1B --dp 6 --ep 4"), "divide"),
        (argv("--params 1B --dp 2 --compute-efficiency 1.5"), "compute-efficiency"),
        # no device, no --inter-bw: no invented 100 GbE for the dp all_reduce across 2 nodes
        (argv("--params 1B --devices 16 --dp 16 --gpus-per-node 8"), "--inter-bw"),
        # The flags the TP traffic still needs, and no other: --seq-len and --global-batch are in.
        (argv("--params 7B --seq-len 4096 --global-batch 512 --tp 2 --dp 4"),
         "the traffic of --tp 2 is sized by the activations, which need --layers and --hidden; "
         "given: --seq-len, --global-batch"),
        (argv("--params 7B --tokens-per-step 2M --layers 32 --hidden 4096 --seq-len 4096 --pp 2"),
         "need --global-batch (--tokens-per-step does not say how it splits into sequences)"),
    ],
)  # fmt: skip
def test_errors_exit_2(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(args, capsys)
    assert code == 2
    assert message in err


def test_text_output_through_the_dispatcher(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calc", *SEED_2B]) == 0
    out = capsys.readouterr().out
    assert "MFU: 0.375" in out
    assert "HFU: 0.500" in out
    assert "can hide" in out


def test_tp_can_hide_only_with_a_framework_that_overlaps_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = argv(
        "--params 70.6B --layers 80 --hidden 8192 --seq-len 8192 --global-batch 1024 "
        "--device h100-sxm --step-time 12.5 --tp 8 --pp 4 --dp 32 --microbatches 16"
    )
    code, result, _ = _run(args, capsys)
    assert code == 0
    by_axis = {a["axis"]: a for a in result["comm"]["axes"]}
    assert by_axis["tp"]["hideable"] and not by_axis["tp"]["overlapped_by_default"]
    assert by_axis["dp"]["overlapped_by_default"]
    assert main(["calc", *args]) == 0  # the text output
    out = capsys.readouterr().out
    (tp_line,) = [line for line in out.splitlines() if line.strip().startswith("tp ")]
    assert tp_line.endswith("can hide only if the framework overlaps it (exposed by default)")
    (dp_line,) = [line for line in out.splitlines() if line.strip().startswith("dp ")]
    assert dp_line.endswith("can hide")


@pytest.mark.parametrize(("text", "value"), [("70B", 70e9), ("989.4T", 989.4e12), ("1e5", 1e5)])
def test_number_suffixes(text: str, value: float) -> None:
    assert _number(text) == pytest.approx(value)


@pytest.mark.slow  # a child Python process (a fresh import)
def test_calc_never_imports_torch() -> None:
    code = (
        "import argparse, sys\n"
        "import mfuscope.cli.calc as calc\n"
        "p = argparse.ArgumentParser(); calc.add_arguments(p)\n"
        "calc.run(p.parse_args('--params 7B --layers 32 --hidden 4096 --seq-len 4096 "
        "--global-batch 512 --device h100-sxm --step-time 3 --tp 8 --dp 8'.split()))\n"
        "assert 'torch' not in sys.modules, 'calc imported torch'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "MFU" in done.stdout
