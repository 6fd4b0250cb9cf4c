"""What each low-precision format does to a layer's weights and to its inputs.

==============  ===========================================  ===========================================
precision       weight                                       input (activation)
==============  ===========================================  ===========================================
``nvfp4``       NVFP4, blocks of 16 along the input dim      NVFP4, dynamic per-tensor amax per call
``nvfp4_w4a16`` NVFP4, blocks of 16 along the input dim      unchanged
``fp8``         E4M3, one per-tensor scale (``max|W|``)      E4M3, dynamic per-tensor amax per call
``none``        unchanged (no quantized layers at all)       unchanged
==============  ===========================================  ===========================================

Weights are 2-D ``[out, in]`` here and inputs are ``[..., in]``, so NVFP4 blocks always run along the
GEMM's reduction dimension; a 1×1 convolution is presented in that layout by its layer.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

from diffusion.quant.fp8 import fp8_fake_quant
from diffusion.quant.nvfp4 import nvfp4_fake_quant

Precision = Literal["nvfp4", "nvfp4_w4a16", "fp8", "none"]
PRECISIONS: tuple[str, ...] = get_args(Precision)
QUANTIZED_PRECISIONS: tuple[str, ...] = tuple(p for p in PRECISIONS if p != "none")
# Precisions whose weights are NVFP4: the weight-sync `nvfp4` codec ships exactly these packed.
NVFP4_WEIGHT_PRECISIONS: tuple[str, ...] = ("nvfp4", "nvfp4_w4a16")


def check_precision(precision: str, allowed: tuple[str, ...] = PRECISIONS) -> None:
    """Raise ``ValueError`` naming the allowed values unless ``precision`` is one of them."""
    if precision not in allowed:
        raise ValueError(f"unknown precision {precision!r}; expected one of {list(allowed)}")


@torch.no_grad()
def quantize_weight(weight: torch.Tensor, precision: Precision, block_size: int = 16) -> torch.Tensor:
    """The fake-quantized ``[out, in]`` weight: NVFP4 (``block_size`` along ``in``) or per-tensor FP8."""
    if precision == "fp8":
        return fp8_fake_quant(weight, weight.abs().amax().float())
    return nvfp4_fake_quant(weight, block_size)


@torch.no_grad()
def quantize_input(x: torch.Tensor, precision: Precision, block_size: int = 16) -> torch.Tensor:
    """The input as the layer's GEMM sees it: fake-quantized for W4A4/FP8, unchanged for W4A16.

    One dynamic per-tensor amax (``max|x|`` over the whole call) scales every sample in the batch.
    """
    if precision == "nvfp4":
        return nvfp4_fake_quant(x, block_size)
    if precision == "fp8":
        return fp8_fake_quant(x)
    return x
