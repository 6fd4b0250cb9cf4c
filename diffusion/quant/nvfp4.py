"""NVFP4 block quantization as pure tensor functions.

Format: E2M1 elements (magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6} and a sign bit), blocks of
``block_size`` (16) consecutive elements along the last dim sharing one FP8 E4M3 scale, and one
FP32 scale per tensor::

    g     = amax(|x|) / (6 · 448)
    s_b   = e4m3(clamp(amax_b / (6 · g), 2^-9, 448))         (an all-zero block gets s_b = 1)
    code  = e2m1(x / (s_b · g))                               (round to nearest, ties to even)
    value = code · (s_b · g)

Every floating-point operation above is carried out in FP32 in the same order as
``modelopt.torch.quantization.qtensor.nvfp4_tensor.NVFP4QTensor.quantize`` followed by
``.dequantize`` (nvidia-modelopt 0.47), so results are bit-identical to that round trip.
Known, deliberate differences from modelopt:

* An all-zero tensor (more precisely: one whose ``amax / 2688`` is 0 in FP32) quantizes to exact
  zeros with ``g = 1``; modelopt divides 0 by 0 there and returns NaN.
* A last dim that is not a multiple of ``block_size`` is zero-padded, quantized, and sliced back;
  modelopt pads when quantizing but its dequantize cannot reshape the padded data back.
* The E2M1 rounding uses an add-and-subtract trick instead of modelopt's ``searchsorted``. It gives
  the same values, signed zeros included, for every FP32 input with |y| < 16 (checked once over
  all 2^31 such bit patterns) and saturates to ±6 above, as modelopt does; the tests re-check it
  densely around every rounding boundary.

These functions build no autograd graph: they serve low-precision rollouts, not training.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

E2M1_MAX = 6.0
E4M3_MAX = 448.0
BLOCK_SCALE_MIN = 2.0**-9

# Indexed by the 4-bit code: bit 3 is the sign, bits 0-2 index the magnitude. Code 8 ("-0")
# decodes to +0.0, as in modelopt's table.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)

# 2·|value| -> magnitude code for the 8 representable magnitudes (0xFF marks impossible entries).
_CODE_OF_TWICE_MAGNITUDE = (0, 1, 2, 3, 4, 0xFF, 5, 0xFF, 6, 0xFF, 0xFF, 0xFF, 7)

_F32_EXPONENT_MASK = 0x7F800000
_F32_ONE_BITS = 0x3F800000
_F32_FOUR_BITS = 0x40800000


@dataclass(frozen=True)
class NVFP4Packed:
    """An NVFP4 tensor in storage form, laid out exactly like modelopt's ``NVFP4QTensor``.

    ``codes``: uint8, shape ``(*shape[:-1], padded_last // 2)``; byte ``j`` holds element ``2j`` in
    its low nibble and element ``2j + 1`` in its high nibble. ``block_scales``: float8_e4m3fn, shape
    ``(*shape[:-1], padded_last // block_size)``. ``global_scale``: float32 scalar ``g``.
    ``shape``/``dtype``: the original tensor's (before padding).
    """

    codes: torch.Tensor
    block_scales: torch.Tensor
    global_scale: torch.Tensor
    shape: torch.Size
    dtype: torch.dtype

    @property
    def block_size(self) -> int:
        """Elements per block scale."""
        return 2 * self.codes.shape[-1] // self.block_scales.shape[-1]


def _check_args(x: torch.Tensor, block_size: int) -> None:
    if x.dim() == 0:
        raise ValueError("NVFP4 quantizes along the last dim; got a 0-d tensor")
    if not x.is_floating_point():
        raise TypeError(f"NVFP4 expects a floating-point tensor, got {x.dtype}")
    if block_size <= 0 or block_size % 2:
        raise ValueError(f"block_size must be a positive even number, got {block_size}")


def _to_blocks(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """View ``x`` as ``(*x.shape[:-1], n_blocks, block_size)``, zero-padding the last dim."""
    pad = -x.shape[-1] % block_size
    if pad:
        x = F.pad(x, (0, pad))
    return x.reshape(*x.shape[:-1], -1, block_size)


def _block_amax(blocks: torch.Tensor) -> torch.Tensor:
    """``max |x|`` over the last dim (the block), in the input dtype (exact: it is one of the inputs)."""
    a = blocks.abs()
    # Pairwise halving is several times faster on CPU than amax over a 16-wide innermost dim.
    while a.shape[-1] % 2 == 0:
        half = a.shape[-1] // 2
        a = torch.maximum(a[..., :half], a[..., half:])
    return a.amax(dim=-1)


def _scales(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-block E4M3 scales ``s_b`` and the per-tensor FP32 scale ``g``.

    ``g = amax / (6·448)``; ``s_b = e4m3(clamp(amax_b / (6·g), 2^-9, 448))`` with all-zero blocks
    mapped to 1 before the clamp. The FP32 operation order (``6·g`` rounded first, then the division)
    is modelopt's, which is what makes the scales bit-identical.
    """
    block_amax = _block_amax(blocks).float()
    g = block_amax.amax() / (E2M1_MAX * E4M3_MAX)
    # An all-zero tensor would divide 0 by 0 (modelopt's NaN); any positive g encodes it exactly.
    g = torch.where(g == 0, torch.ones_like(g), g)
    per_block = block_amax / (E2M1_MAX * g)
    per_block = torch.where(per_block == 0, torch.ones_like(per_block), per_block)
    block_scales = per_block.clamp(min=BLOCK_SCALE_MIN, max=E4M3_MAX).to(torch.float8_e4m3fn)
    return block_scales, g


def _round_to_e2m1(y: torch.Tensor) -> torch.Tensor:
    """Round float32 ``y`` in place to the nearest signed E2M1 value, ties to even, saturating at ±6.

    The E2M1 grid has spacing 0.5 on [0, 2), 1 on [2, 4) and 2 on [4, 6]. Adding ``c = ±2^22`` (resp.
    2^23, 2^24), whose FP32 ulp is exactly that spacing, makes the FP32 adder round ``y`` to the grid
    with round-half-to-even; subtracting ``c`` again is exact. ``c`` is built from ``y``'s own exponent
    bits (clamped to [0, 2], then raised by 22) and sign, which is cheaper than comparisons
    and ``where``. ``(y + c) - c`` is +0 whenever the result is zero, matching modelopt's +0 decode of
    code 8. Ties land on even codes, as modelopt's searchsorted rule: 0.25→0, 0.75→1, 1.25→1,
    1.75→2, 2.5→2, 3.5→4, 5→4.
    """
    c_bits = (y.view(torch.int32) & _F32_EXPONENT_MASK).clamp_(_F32_ONE_BITS, _F32_FOUR_BITS)
    c = c_bits.add_(22 << 23).view(torch.float32).copysign_(y)
    return y.add_(c).sub_(c).clamp_(-E2M1_MAX, E2M1_MAX)


def _scaled_blocks(
    x: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x / (s_b·g)`` as FP32 blocks, ``s_b`` (E4M3), ``g``, and ``s_b·g`` (FP32, trailing dim 1)."""
    blocks = _to_blocks(x, block_size)
    block_scales, g = _scales(blocks)
    scale = (block_scales.float() * g).unsqueeze(-1)
    # Dividing (not multiplying by a reciprocal) in FP32 is modelopt's order; a low-precision x is
    # promoted exactly.
    return blocks / scale, block_scales, g, scale


def _restore(values: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """Flatten FP32 blocks back to ``shape`` (dropping padding) and cast to ``dtype``."""
    values = values.reshape(*shape[:-1], -1)[..., : shape[-1]]
    return values.to(dtype)


@torch.no_grad()
def nvfp4_fake_quant(x: torch.Tensor, block_size: int = 16) -> torch.Tensor:
    """Quantize ``x`` to NVFP4 and dequantize it again: ``code · (s_b·g)`` cast to ``x.dtype``.

    Same shape and dtype as ``x`` (bf16, fp16 or fp32, any number of leading dims). The per-tensor
    amax is ``max|x|`` over the whole tensor. Bit-identical to modelopt's quantize/dequantize round
    trip (see the module docstring for the all-zero and padding cases).
    """
    _check_args(x, block_size)
    if x.numel() == 0:
        return x.clone()
    y, _, _, scale = _scaled_blocks(x, block_size)
    return _restore(_round_to_e2m1(y).mul_(scale), x.shape, x.dtype)


@torch.no_grad()
def nvfp4_quantize(x: torch.Tensor, block_size: int = 16) -> NVFP4Packed:
    """Quantize ``x`` to packed NVFP4 codes plus scales (modelopt's ``_quantized_data`` layout).

    The sign bit is ``x / (s_b·g) < 0`` before rounding, so small negatives that round to zero get
    code 8, exactly as modelopt packs them.
    """
    _check_args(x, block_size)
    if x.numel() == 0:
        raise ValueError("cannot quantize an empty tensor")
    y, block_scales, g, _ = _scaled_blocks(x, block_size)
    negative = y < 0
    twice_magnitude = _round_to_e2m1(y).abs_().mul_(2).to(torch.int64)
    lut = torch.tensor(_CODE_OF_TWICE_MAGNITUDE, dtype=torch.uint8, device=x.device)
    codes = lut[twice_magnitude] | (negative.to(torch.uint8) << 3)
    codes = codes.reshape(*codes.shape[:-2], -1)
    packed = (codes[..., 1::2] << 4) | codes[..., 0::2]
    return NVFP4Packed(packed, block_scales, g, x.shape, x.dtype)


@torch.no_grad()
def nvfp4_dequantize(packed: NVFP4Packed) -> torch.Tensor:
    """Decode packed NVFP4: ``E2M1_VALUES[code] · (s_b·g)`` in FP32, then cast to the original dtype.

    ``nvfp4_dequantize(nvfp4_quantize(x))`` equals ``nvfp4_fake_quant(x)`` bit for bit.
    """
    codes = torch.stack((packed.codes & 0x0F, packed.codes >> 4), dim=-1).flatten(-2)
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    values = table[codes.to(torch.int64)]
    values = values.reshape(*values.shape[:-1], packed.block_scales.shape[-1], -1)
    scale = (packed.block_scales.float() * packed.global_scale).unsqueeze(-1)
    return _restore(values * scale, packed.shape, packed.dtype)
