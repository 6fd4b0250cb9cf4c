"""What each low-precision format does to a layer's weights and to its inputs.

==============  ===========================================  ===========================================
precision       weight                                       input (activation)
==============  ===========================================  ===========================================
``nvfp4``       NVFP4, blocks of 16 along the input dim      NVFP4, dynamic per-tensor amax per call
``nvfp4_w4a16`` NVFP4, blocks of 16 along the input dim      unchanged
``fp8``         E4M3, a scale per output channel (row of W)  E4M3, a dynamic scale per row (token)
``fp8_tensor``  E4M3, one per-tensor scale (``max|W|``)      E4M3, dynamic per-tensor amax per call
``none``        unchanged (no quantized layers at all)       unchanged
==============  ===========================================  ===========================================

Weights are 2-D ``[out, in]`` here and inputs are ``[..., in]``, so NVFP4 blocks always run along the
GEMM's reduction dimension; a 1×1 convolution is presented in that layout by its layer.

``fp8`` is torchao's ``PerRow`` granularity (its recommended accuracy mode): a row's codes depend on that row
alone, so a candidate's FP8 proxy is the same whatever else shares its batch. ``fp8_tensor`` (torchao's
``PerTensor``, one activation scale over the whole ``[B, tokens, C]`` input) is faster to scale but couples
the candidates of a batch. NVFP4's activations keep their per-tensor second-level scale, the format's two-level
recipe, so an NVFP4 proxy can still move by a rounding of its E4M3 block scales with its batchmates.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

from diffusion.quant.fp8 import fp8_fake_quant
from diffusion.quant.nvfp4 import nvfp4_fake_quant

Precision = Literal["nvfp4", "nvfp4_w4a16", "fp8", "fp8_tensor", "none"]
PRECISIONS: tuple[str, ...] = get_args(Precision)
QUANTIZED_PRECISIONS: tuple[str, ...] = tuple(p for p in PRECISIONS if p != "none")
# Precisions whose weights are NVFP4: the weight-sync `nvfp4` codec ships exactly these packed.
NVFP4_WEIGHT_PRECISIONS: tuple[str, ...] = ("nvfp4", "nvfp4_w4a16")
# The E4M3 precisions, by how each scales: per row (token / output channel) or per tensor.
FP8_PRECISIONS: tuple[str, ...] = ("fp8", "fp8_tensor")


def check_precision(precision: str, allowed: tuple[str, ...] = PRECISIONS) -> None:
    """Raise ``ValueError`` naming the allowed values unless ``precision`` is one of them."""
    if precision not in allowed:
        raise ValueError(f"unknown precision {precision!r}; expected one of {list(allowed)}")


@torch.no_grad()
def quantize_weight(weight: torch.Tensor, precision: Precision, block_size: int = 16) -> torch.Tensor:
    """The fake-quantized ``[out, in]`` weight: NVFP4 (``block_size`` along ``in``), FP8 per output channel
    (``fp8``) or per tensor (``fp8_tensor``)."""
    if precision == "fp8":
        return fp8_fake_quant(weight, weight.abs().amax(dim=-1, keepdim=True).float())
    if precision == "fp8_tensor":
        return fp8_fake_quant(weight, weight.abs().amax().float())
    return nvfp4_fake_quant(weight, block_size)


@torch.no_grad()
def quantize_input(x: torch.Tensor, precision: Precision, block_size: int = 16) -> torch.Tensor:
    """The input as the layer's GEMM sees it: fake-quantized for W4A4/FP8, unchanged for W4A16.

    ``fp8``: a dynamic amax per row (``max|x|`` over the last dim); ``fp8_tensor`` and ``nvfp4``: one dynamic
    per-tensor amax over the whole call, which every sample in the batch shares.
    """
    if precision == "nvfp4":
        return nvfp4_fake_quant(x, block_size)
    if precision == "fp8":
        return fp8_fake_quant(x, x.abs().amax(dim=-1, keepdim=True).float() if x.numel() else None)
    if precision == "fp8_tensor":
        return fp8_fake_quant(x)
    return x
