"""Low-precision exploration: NVFP4/FP8 numerics, the layer rule, backends and quantized engines.

Modules, one concept each: ``nvfp4`` / ``fp8`` (bit-exact formats), ``precision`` (what a precision
does to weights and inputs), ``layer_rule`` (which layers are replaced), ``project_backend`` /
``modelopt_backend`` / ``te_backend`` (how they run), ``backends`` (registry and choice), ``engine``
(build, load, refresh).
"""

from diffusion.quant.backends import BACKENDS, Backend, QuantBackend, get_backend, resolve_backend
from diffusion.quant.engine import (
    build_engine,
    engine_layers,
    load_weights,
    refresh_quantizers,
    weight_tensors,
)
from diffusion.quant.fp8 import fp8_fake_quant
from diffusion.quant.layer_rule import (
    EligibleLayers,
    eligible_conv1x1_names,
    eligible_layers,
    eligible_linear_names,
    is_conv1x1,
)
from diffusion.quant.nvfp4 import NVFP4Packed, nvfp4_dequantize, nvfp4_fake_quant, nvfp4_quantize
from diffusion.quant.precision import NVFP4_WEIGHT_PRECISIONS, PRECISIONS, QUANTIZED_PRECISIONS, Precision
from diffusion.quant.project_backend import QuantConv1x1, QuantLinear
from diffusion.quant.te_backend import fp4_autocast, is_blackwell, swap_to_te_linear, te_available

__all__ = [
    "BACKENDS",
    "NVFP4_WEIGHT_PRECISIONS",
    "PRECISIONS",
    "QUANTIZED_PRECISIONS",
    "Backend",
    "EligibleLayers",
    "NVFP4Packed",
    "Precision",
    "QuantBackend",
    "QuantConv1x1",
    "QuantLinear",
    "build_engine",
    "eligible_conv1x1_names",
    "eligible_layers",
    "eligible_linear_names",
    "engine_layers",
    "fp4_autocast",
    "fp8_fake_quant",
    "get_backend",
    "is_blackwell",
    "is_conv1x1",
    "load_weights",
    "nvfp4_dequantize",
    "nvfp4_fake_quant",
    "nvfp4_quantize",
    "refresh_quantizers",
    "resolve_backend",
    "swap_to_te_linear",
    "te_available",
    "weight_tensors",
]
