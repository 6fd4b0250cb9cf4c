"""NVFP4 and per-tensor FP8 numerics, checked bit for bit against nvidia-modelopt as the oracle."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from diffusion.quant import fp8_fake_quant, nvfp4_dequantize, nvfp4_fake_quant, nvfp4_quantize
from diffusion.quant.nvfp4 import E2M1_VALUES, _round_to_e2m1

with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)  # modelopt warns about the untested transformers version
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor, e2m1_values
    from modelopt.torch.quantization.tensor_quant import scaled_e4m3

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
_BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def assert_bitwise_equal(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Same dtype, shape and bit pattern (so +0 vs -0 and NaN payloads count), and NaN-free."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert not torch.isnan(actual).any()
    assert torch.equal(actual.view(_BITS[actual.dtype]), expected.view(_BITS[expected.dtype]))


def modelopt_round_trip(x: torch.Tensor, block_size: int = 16) -> torch.Tensor:
    """modelopt quantize -> dequantize; a ragged last dim is zero-padded first (its dequantize
    cannot un-pad) and sliced back afterwards."""
    padded = F.pad(x, (0, -x.shape[-1] % block_size))
    qtensor, scale, scale2 = NVFP4QTensor.quantize(padded.clone(), block_size)
    out = qtensor.dequantize(scale=scale, double_scale=scale2, block_sizes={-1: block_size})
    return out[..., : x.shape[-1]]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(64, 64), (3, 7, 48), (256, 128), (2, 2, 2, 32), (1, 16)])
def test_matches_modelopt_on_normal_data(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x = (torch.randn(shape, generator=gen(0)) * 2.5).to(dtype)
    assert_bitwise_equal(nvfp4_fake_quant(x), modelopt_round_trip(x))


@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_modelopt_on_heavy_tailed_data(dtype: torch.dtype) -> None:
    g = gen(1)
    cauchy = torch.tan(math.pi * (torch.rand(96, 128, generator=g) - 0.5))  # Student-t, 1 dof
    outliers = torch.randn(96, 128, generator=g)
    outliers[torch.rand(96, 128, generator=g) < 0.01] *= 300.0
    for x in (cauchy.clamp(-6e4, 6e4), outliers):
        x = x.to(dtype)
        assert_bitwise_equal(nvfp4_fake_quant(x), modelopt_round_trip(x))


def test_zero_blocks_inside_a_nonzero_tensor() -> None:
    x = torch.randn(8, 64, generator=gen(2))
    x[2, 16:32] = 0.0
    x[5] = 0.0
    out = nvfp4_fake_quant(x)
    assert_bitwise_equal(out, modelopt_round_trip(x))
    assert not out[2, 16:32].any() and not out[5].any()
    # modelopt's zeros -> 1.0 rule for the scale of an all-zero block.
    scales = nvfp4_quantize(x).block_scales.float()
    assert scales[2, 1] == 1.0 and bool((scales[5] == 1.0).all())


def test_block_scales_saturate_at_448_and_floor_at_2_pow_minus_9() -> None:
    amax = 349.3934631347656  # FP32 rounding puts amax / (6 · (amax / 2688)) just above 448
    amax_t = torch.tensor(amax)
    assert amax_t / (6.0 * (amax_t / 2688.0)) > 448.0
    x = torch.randn(4, 64, generator=gen(3))
    x[0, 0] = amax
    x[1, 16:32] *= 1e-7  # a block scale far below 2^-9: clamped up to the floor
    packed = nvfp4_quantize(x)
    scales = packed.block_scales.float()
    assert scales[0, 0] == 448.0 and scales.max() == 448.0
    assert scales[1, 1] == 2.0**-9 and scales.min() == 2.0**-9
    assert_bitwise_equal(nvfp4_fake_quant(x), modelopt_round_trip(x))


@pytest.mark.parametrize("dtype", DTYPES)
def test_exact_ties_round_to_even(dtype: torch.dtype) -> None:
    # amax = 2688 makes g = 1 exactly; a block whose amax is 6·s (s in E4M3) has scale s, so its
    # elements reach the E2M1 rounding step as x / s, exactly on the midpoints between grid values.
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    block = torch.tensor([6.0, *ties, *(-t for t in ties), 0.0])
    x = torch.cat([torch.full((16,), 2688.0), block, 2.0 * block, 0.5 * block]).to(dtype)
    expected = torch.tensor([6.0, 0, 1, 1, 2, 2, 4, 4, 0, -1, -1, -2, -2, -4, -4, 0])
    out = nvfp4_fake_quant(x)
    assert out[16:32].tolist() == expected.tolist()
    assert out[32:48].tolist() == (2.0 * expected).tolist()
    assert out[48:64].tolist() == (0.5 * expected).tolist()
    assert_bitwise_equal(out, modelopt_round_trip(x))


def test_e2m1_rounding_equals_modelopt_searchsorted_near_every_boundary() -> None:
    dense = torch.arange(-8 * 4096, 8 * 4096 + 1, dtype=torch.float32) / 4096
    points = torch.tensor([0.0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6, 8])
    neighbours = [points]
    for direction in (math.inf, -math.inf):
        current = points
        for _ in range(4):
            current = torch.nextafter(current, torch.tensor(direction))
            neighbours.append(current)
    special = torch.tensor([6.5, 7.0, 100.0, 1e30, math.inf, 1e-45, 1e-30])
    y = torch.cat([dense, *neighbours, special])
    y = torch.cat([y, -y])
    expected = e2m1_values[NVFP4QTensor._cast_fp4(y.clone()).long()]
    assert_bitwise_equal(_round_to_e2m1(y.clone()), expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 20), (3, 4, 37), (7,), (2, 1)])
def test_ragged_last_dim_matches_modelopt_on_the_zero_padded_tensor(
    shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    x = torch.randn(shape, generator=gen(4)).to(dtype)
    out = nvfp4_fake_quant(x)
    assert out.shape == x.shape
    assert_bitwise_equal(out, modelopt_round_trip(x))
    assert_bitwise_equal(nvfp4_dequantize(nvfp4_quantize(x)), out)


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_zero_tensor_gives_zeros_where_modelopt_gives_nan(dtype: torch.dtype) -> None:
    x = torch.zeros(4, 32, dtype=dtype)
    assert_bitwise_equal(nvfp4_fake_quant(x), x)
    assert_bitwise_equal(nvfp4_dequantize(nvfp4_quantize(x)), x)
    assert torch.isnan(modelopt_round_trip(x)).all()  # the divergence documented in nvfp4.py


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(32, 64), (2, 3, 48), (5, 37)])
def test_packed_layout_equals_modelopt(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x = (torch.randn(shape, generator=gen(5)) * 4).to(dtype)
    qtensor, scale, scale2 = NVFP4QTensor.quantize(x.clone(), 16)
    packed = nvfp4_quantize(x)
    assert packed.codes.dtype == torch.uint8 and torch.equal(packed.codes, qtensor._quantized_data)
    assert packed.block_scales.dtype == torch.float8_e4m3fn
    assert torch.equal(packed.block_scales.view(torch.uint8), scale.view(torch.uint8))
    assert packed.global_scale.dtype == torch.float32 and packed.global_scale.dim() == 0
    assert torch.equal(packed.global_scale, scale2)
    assert (packed.shape, packed.dtype, packed.block_size) == (x.shape, dtype, 16)


def test_low_nibble_holds_the_even_element() -> None:
    # g = 1 and scale 1: element 0 -> 0.5 (code 1), element 1 -> -6 (code 15), then 2688 -> 6.
    x = torch.tensor([0.5, -6.0] + [0.0] * 14 + [2688.0] + [0.0] * 15)
    packed = nvfp4_quantize(x)
    assert packed.codes[0].item() == (15 << 4) | 1
    assert packed.codes[8].item() == 7


@pytest.mark.parametrize("dtype", DTYPES)
def test_fake_quant_equals_dequantize_of_quantize(dtype: torch.dtype) -> None:
    x = (torch.randn(6, 5, 80, generator=gen(6)) * 3).to(dtype)
    assert_bitwise_equal(nvfp4_dequantize(nvfp4_quantize(x)), nvfp4_fake_quant(x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [-6, 0, 4])
def test_idempotent_when_global_scale_is_a_power_of_two(dtype: torch.dtype, k: int) -> None:
    x = torch.randn(16, 64, generator=gen(7))
    x = (x * (2688.0 * 2.0**k / x.abs().max())).to(dtype)  # amax = 2688·2^k, so g = 2^k
    once = nvfp4_fake_quant(x)
    assert_bitwise_equal(nvfp4_fake_quant(once), once)


def test_requantizing_moves_values_only_through_the_global_scale() -> None:
    """Exact idempotence is not universal in FP32: g' = max|fq(x)| / 2688 can differ from g by an
    ulp. Block scales and codes are stable (up to the sign of zero, which dequantization drops)."""

    def nibbles(codes: torch.Tensor) -> torch.Tensor:
        unpacked = torch.stack((codes & 0x0F, codes >> 4), dim=-1)
        return torch.where(unpacked == 8, 0, unpacked)

    moved = 0
    g = gen(8)
    for _ in range(40):
        x = torch.randn(32, 64, generator=g) * (0.01 + 10 * torch.rand(1, generator=g))
        once = nvfp4_fake_quant(x)
        twice = nvfp4_fake_quant(once)
        first, second = nvfp4_quantize(x), nvfp4_quantize(once)
        assert torch.equal(first.block_scales.view(torch.uint8), second.block_scales.view(torch.uint8))
        assert torch.equal(nibbles(first.codes), nibbles(second.codes))
        if torch.equal(first.global_scale, second.global_scale):
            assert_bitwise_equal(twice, once)
        else:
            moved += 1
            torch.testing.assert_close(twice, once, rtol=2.0**-22, atol=0.0)
    assert 0 < moved < 40  # both cases occur on these seeds


@pytest.mark.parametrize("block_size", [16, 32])
def test_values_lie_on_the_per_block_grid(block_size: int) -> None:
    x = torch.randn(24, 96, generator=gen(9)) * 7
    packed = nvfp4_quantize(x, block_size)
    out = nvfp4_fake_quant(x, block_size).reshape(24, -1, block_size)
    grid = torch.tensor(sorted(set(E2M1_VALUES)))
    scale = packed.block_scales.float() * packed.global_scale
    candidates = grid * scale[..., None]  # (24, n_blocks, 15): code · s_b · g
    assert bool((out[..., None] == candidates[..., None, :]).any(dim=-1).all())


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="0-d"):
        nvfp4_fake_quant(torch.tensor(1.0))
    with pytest.raises(TypeError, match="floating-point"):
        nvfp4_fake_quant(torch.ones(16, dtype=torch.int32))
    with pytest.raises(ValueError, match="block_size"):
        nvfp4_fake_quant(torch.ones(16), block_size=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fp8_matches_modelopt_scaled_e4m3(dtype: torch.dtype) -> None:
    x = (torch.randn(64, 48, generator=gen(10)) * 5).to(dtype)
    expected = scaled_e4m3(x, x.abs().amax().float(), None, 4, 3)  # modelopt's CPU FP8 path
    assert_bitwise_equal(fp8_fake_quant(x), expected)
    fixed = scaled_e4m3(x, torch.tensor(2.0), None, 4, 3)  # amax below max|x|: values saturate
    assert_bitwise_equal(fp8_fake_quant(x, 2.0), fixed)
    assert fp8_fake_quant(x, 2.0).abs().max().item() == 2.0


def test_fp8_keeps_zeros_and_representable_values() -> None:
    assert_bitwise_equal(fp8_fake_quant(torch.zeros(3, 5)), torch.zeros(3, 5))
    # With amax = 448 the scale is 1, so E4M3-representable values pass through unchanged.
    x = torch.tensor([448.0, -448.0, 1.0, 0.5, -0.125, 2.0**-9, 240.0])
    assert_bitwise_equal(fp8_fake_quant(x), x)
