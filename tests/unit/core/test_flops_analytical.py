"""Analytical transformer FLOPs against the published figures (PaLM, Megatron-LM, the seeds)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mfuscope.core.flops import (
    TransformerShape,
    count_params,
    transformer_flops_per_token,
)
from mfuscope.core.mfu import hfu, mfu

# Narayanan et al. 2021 (arXiv 2104.04473), Table 1: GPT models, V = 51200, s = 2048, A100s.
# (params B, heads, hidden, layers, GPUs, batch, achieved TFLOP/s per GPU, % of 312 TFLOP/s)
MEGATRON_TABLE_1 = [
    (1.7, 24, 2304, 24, 32, 512, 137, 44),
    (3.6, 32, 3072, 30, 64, 512, 138, 44),
    (7.5, 32, 4096, 36, 128, 512, 142, 46),
    (18.4, 48, 6144, 40, 256, 1024, 135, 43),
    (39.1, 64, 8192, 48, 512, 1536, 138, 44),
    (76.1, 80, 10240, 60, 1024, 1792, 140, 45),
    (145.6, 96, 12288, 80, 1536, 2304, 148, 47),
    (310.1, 128, 16384, 96, 1920, 2160, 155, 50),
    (529.6, 128, 20480, 105, 2520, 2520, 163, 52),
    (1008.0, 160, 25600, 128, 3072, 3072, 163, 52),
]
V, S = 51200, 2048


def _megatron_shape(heads: int, hidden: int, layers: int) -> TransformerShape:
    return TransformerShape(
        layers=layers, hidden=hidden, heads=heads, vocab=V, tied_embeddings=True
    )


@pytest.mark.parametrize("row", MEGATRON_TABLE_1, ids=lambda r: f"{r[0]}B")
def test_megatron_eq3_is_reproduced_exactly(row: tuple[float, ...]) -> None:
    # Eq. 3 counts full activation recomputation: F = 96 B s l h^2 (1 + s/6h + V/16lh).
    _, heads, hidden, layers, _, batch, _, _ = row
    shape = _megatron_shape(int(heads), int(hidden), int(layers))
    token = transformer_flops_per_token(shape, seq_len=S, recompute="full", convention="megatron")
    n_layers, h, b = layers, hidden, batch
    eq3 = 96 * b * S * n_layers * h * h * (1 + S / (6 * h) + V / (16 * n_layers * h))
    assert token.hardware * b * S == pytest.approx(eq3, rel=1e-12)
    # Without recomputation the layers cost 3 passes instead of 4; the logits stay at 3.
    plain = 72 * b * S * n_layers * h * h * (1 + S / (6 * h)) + 6 * b * S * h * V
    assert token.model * b * S == pytest.approx(plain, rel=1e-12)


@pytest.mark.parametrize("row", MEGATRON_TABLE_1, ids=lambda r: f"{r[0]}B")
def test_megatron_table1_percent_of_peak(row: tuple[float, ...]) -> None:
    # The paper's "% of theoretical peak" is HFU (its FLOPs include recomputation): running the
    # reported per-GPU throughput back through our HFU gives the printed percentage.
    _, heads, hidden, layers, gpus, batch, tflops, percent = row
    shape = _megatron_shape(int(heads), int(hidden), int(layers))
    token = transformer_flops_per_token(shape, seq_len=S, recompute="full", convention="megatron")
    per_gpu_model = token.model * batch * S / gpus
    per_gpu_recompute = token.recompute * batch * S / gpus
    iteration_s = (per_gpu_model + per_gpu_recompute) / (tflops * 1e12)
    utilisation = hfu(per_gpu_model, per_gpu_recompute, 312e12, iteration_s)
    assert round(utilisation * 100) == percent
    assert mfu(per_gpu_model, 312e12, iteration_s) < utilisation


@pytest.mark.parametrize("row", MEGATRON_TABLE_1, ids=lambda r: f"{r[0]}B")
def test_parameter_count_matches_megatron_eq2(row: tuple[float, ...]) -> None:
    # Eq. 2: P = 12 l h^2 (1 + 13/12h + (V + s)/12lh). We count matmul weights only (no biases,
    # norms or learned positions), so we sit a little under it.
    billions, heads, hidden, layers, *_ = row
    n_layers, h = layers, hidden
    eq2 = 12 * n_layers * h * h * (1 + 13 / (12 * h) + (V + S) / (12 * n_layers * h))
    counted = count_params(_megatron_shape(int(heads), int(hidden), int(layers))).total
    assert counted == pytest.approx(eq2, rel=0.005)
    assert counted <= eq2
    assert round(eq2 / 1e9, 1) == billions


def test_palm_540b_mfu_is_46_2_percent() -> None:
    # Chowdhery et al. 2022 (PaLM), sec. 4 / appendix B: 540.35B parameters, 118 layers,
    # 48 heads of 256, T = 2048; 238.3K tokens/s on 6144 TPU v4 chips of 275 TFLOP/s: MFU 46.2%.
    shape = TransformerShape(layers=118, hidden=18432, heads=48, head_dim=256)
    token = transformer_flops_per_token(shape, seq_len=2048, params=540.35e9)
    assert token.attention == pytest.approx(12 * 118 * 48 * 256 * 2048)
    assert token.model == pytest.approx(6 * 540.35e9 + 12 * 118 * 48 * 256 * 2048)
    utilisation = mfu(token.model * 238.3e3, 6144 * 275e12, 1.0)
    assert round(utilisation * 100, 1) == 46.2


def test_seed_2b_model_on_8_gpus() -> None:
    # ml-engineering "Networking" seed, "Calculating TFLOPS": 2B parameters, seqlen 2048,
    # global batch 16, 8 GPUs, recomputation on (factor 4 instead of 3):
    # 2 * 4 * 2 * 2048 * 16 / 8 = 65.536 TFLOP per GPU per iteration; 0.42 s at 50% of 312.
    token = transformer_flops_per_token(seq_len=2048, params=2e9, recompute="full")
    per_gpu = token.hardware * 2048 * 16 / 8
    assert per_gpu == pytest.approx(65.536e12)
    step_s = per_gpu / (0.5 * 312e12)
    assert round(step_s, 2) == 0.42
    per_gpu_model = token.model * 2048 * 16 / 8
    per_gpu_recompute = token.recompute * 2048 * 16 / 8
    assert hfu(per_gpu_model, per_gpu_recompute, 312e12, step_s) == pytest.approx(0.5)
    assert mfu(per_gpu_model, 312e12, step_s) == pytest.approx(0.375)  # 6N of the 8N


def test_gqa_shrinks_parameters_not_attention_flops() -> None:
    mha = TransformerShape(layers=32, hidden=4096, heads=32, vocab=32000)
    gqa = TransformerShape(layers=32, hidden=4096, heads=32, kv_heads=8, vocab=32000)
    assert count_params(gqa).total < count_params(mha).total
    # K/V projections shrink from 2 h^2 to 2 h^2 / 4 per layer
    saved = count_params(mha).total - count_params(gqa).total
    assert saved == 32 * 2 * 4096 * (4096 - 1024)
    a = transformer_flops_per_token(mha, seq_len=4096)
    b = transformer_flops_per_token(gqa, seq_len=4096)
    assert a.attention == b.attention
    assert b.model < a.model


def test_moe_uses_active_parameters() -> None:
    moe = TransformerShape(
        layers=32, hidden=4096, heads=32, ffn_hidden=14336, gated_mlp=True, vocab=32000,
        experts=8, experts_per_token=2,
    )  # fmt: skip
    dense_like = TransformerShape(
        layers=32, hidden=4096, heads=32, ffn_hidden=14336, gated_mlp=True, vocab=32000,
        experts=2, experts_per_token=2,
    )  # fmt: skip
    counts = count_params(moe)
    assert counts.active < counts.total
    assert counts.total - counts.active == 32 * 6 * counts.mlp_per_expert
    # FLOPs follow the active experts: 8 experts with top-2 cost what 2 experts with top-2 cost.
    a = transformer_flops_per_token(moe, seq_len=4096, convention="megatron")
    b = transformer_flops_per_token(dense_like, seq_len=4096, convention="megatron")
    assert a.model == pytest.approx(b.model + 6 * 32 * 4096 * (8 - 2))  # router width only


def test_tied_embeddings() -> None:
    tied = TransformerShape(layers=2, hidden=64, heads=4, vocab=1000, tied_embeddings=True)
    untied = TransformerShape(layers=2, hidden=64, heads=4, vocab=1000)
    assert count_params(untied).total - count_params(tied).total == 1000 * 64
    # Megatron counts GEMMs: the logit GEMM exists either way, the input lookup is free.
    m_tied = transformer_flops_per_token(tied, seq_len=128, convention="megatron")
    m_untied = transformer_flops_per_token(untied, seq_len=128, convention="megatron")
    assert m_tied.model == m_untied.model
    # PaLM's 6N takes N literally, so the untied input table adds 6 V h.
    p_tied = transformer_flops_per_token(tied, seq_len=128)
    p_untied = transformer_flops_per_token(untied, seq_len=128)
    assert p_untied.model - p_tied.model == pytest.approx(6 * 1000 * 64)


def test_conventions_agree_for_a_tied_model_counted_from_its_shape() -> None:
    shape = TransformerShape(layers=4, hidden=256, heads=8, vocab=5000, tied_embeddings=True)
    palm = transformer_flops_per_token(shape, seq_len=512, recompute="full")
    megatron = transformer_flops_per_token(
        shape, seq_len=512, recompute="full", convention="megatron"
    )
    assert palm.model == pytest.approx(megatron.model)
    assert palm.recompute == pytest.approx(megatron.recompute)


def test_recompute_modes() -> None:
    shape = TransformerShape(layers=4, hidden=256, heads=8, vocab=5000)
    modes = {
        m: transformer_flops_per_token(shape, seq_len=512, recompute=m)
        for m in ("none", "selective", "full")
    }
    assert {m.model for m in modes.values()} == {modes["none"].model}  # MFU numerator unchanged
    assert modes["none"].recompute == 0
    assert modes["selective"].recompute == pytest.approx(4 * 4 * 256 * 512)  # attention core
    assert modes["full"].recompute == pytest.approx(
        2 * 4 * count_params(shape).layer_active + 4 * 4 * 256 * 512
    )
    with pytest.raises(ValueError, match="shape"):
        transformer_flops_per_token(seq_len=512, params=1e9, recompute="selective")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"seq_len": 512},  # neither params nor shape
        {"seq_len": 0, "params": 1e9},
        {"seq_len": 512, "params": 1e9, "recompute": "half"},
        {"seq_len": 512, "params": 1e9, "convention": "kaplan"},
        {"seq_len": 512, "params": 1e9, "convention": "megatron"},  # megatron needs the shape
        {"seq_len": 512, "params": -1.0},
    ],
)
def test_bad_inputs_raise(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        transformer_flops_per_token(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"layers": 0, "hidden": 64},
        {"layers": 2, "hidden": 65, "heads": 4},
        {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 3},
        {"layers": 2, "hidden": 64, "experts": 2, "experts_per_token": 3},
        {"layers": 2, "hidden": 64, "kv_heads": 2},
    ],
)
def test_bad_shapes_raise(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        TransformerShape(**kwargs)  # type: ignore[arg-type]


shapes = st.builds(
    TransformerShape,
    layers=st.integers(1, 64),
    hidden=st.sampled_from([64, 128, 512, 1024]),
    heads=st.sampled_from([1, 2, 4, 8]),
    vocab=st.integers(0, 50_000),
    tied_embeddings=st.booleans(),
    gated_mlp=st.booleans(),
)


@given(shapes, st.integers(1, 8192), st.sampled_from(["palm", "megatron"]))
def test_recompute_never_changes_model_flops_and_orders_hardware(
    shape: TransformerShape, seq_len: int, convention: str
) -> None:
    tokens = [
        transformer_flops_per_token(shape, seq_len=seq_len, recompute=m, convention=convention)
        for m in ("none", "selective", "full")
    ]
    assert tokens[0].model == tokens[1].model == tokens[2].model
    assert tokens[0].hardware <= tokens[1].hardware <= tokens[2].hardware
    # one extra forward is at most a third of the model's 3 passes
    assert tokens[2].recompute <= tokens[2].model / 3 + 1e-6 * tokens[2].model


@given(shapes, st.integers(1, 4096), st.integers(1, 4096))
def test_flops_grow_with_sequence_length(shape: TransformerShape, t1: int, t2: int) -> None:
    a = transformer_flops_per_token(shape, seq_len=min(t1, t2))
    b = transformer_flops_per_token(shape, seq_len=max(t1, t2))
    assert a.model <= b.model
    assert b.model - a.model == pytest.approx(b.attention - a.attention)
