"""Low-precision exploration: NVFP4/FP8 numerics and quantized rollout engines."""

from diffusion.quant.engine import (
    BACKENDS,
    PRECISIONS,
    Backend,
    Precision,
    QuantLinear,
    eligible_linear_names,
    load_weights,
    name_matches,
    quantize_model,
    quantized_layer_names,
    refresh_quantizers,
    resolve_backend,
    weight_tensors,
)
from diffusion.quant.fp8 import fp8_fake_quant
from diffusion.quant.nvfp4 import NVFP4Packed, nvfp4_dequantize, nvfp4_fake_quant, nvfp4_quantize
from diffusion.quant.te_backend import fp4_autocast, is_blackwell, swap_to_te_linear, te_available

__all__ = [
    "BACKENDS",
    "PRECISIONS",
    "Backend",
    "NVFP4Packed",
    "Precision",
    "QuantLinear",
    "eligible_linear_names",
    "fp4_autocast",
    "fp8_fake_quant",
    "is_blackwell",
    "load_weights",
    "name_matches",
    "nvfp4_dequantize",
    "nvfp4_fake_quant",
    "nvfp4_quantize",
    "quantize_model",
    "quantized_layer_names",
    "refresh_quantizers",
    "resolve_backend",
    "swap_to_te_linear",
    "te_available",
    "weight_tensors",
]
