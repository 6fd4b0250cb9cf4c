"""Low-precision exploration: NVFP4/FP8 numerics, the layer rule, backends and quantized engines.

Modules, one concept each: ``nvfp4`` / ``fp8`` (bit-exact formats), ``precision`` (what a precision
does to weights and inputs), ``layer_rule`` (which layers are replaced), ``project_backend`` /
``modelopt_backend`` / ``torchao_backend`` / ``te_backend`` (how they run), ``backends`` (registry and
the choice of precision and backend for a device), ``engine`` (build, load, refresh).
"""

from diffusion.quant.backends import (
    BACKENDS,
    PRECISION_REQUESTS,
    Backend,
    DeviceFacts,
    EngineChoice,
    PrecisionRequest,
    QuantBackend,
    choose_engine,
    device_facts,
    get_backend,
    resolve_backend,
)
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
from diffusion.quant.torchao_backend import Float8Conv1x1, Float8Linear, torchao_available

__all__ = [
    "BACKENDS",
    "NVFP4_WEIGHT_PRECISIONS",
    "PRECISIONS",
    "PRECISION_REQUESTS",
    "QUANTIZED_PRECISIONS",
    "Backend",
    "DeviceFacts",
    "EligibleLayers",
    "EngineChoice",
    "Float8Conv1x1",
    "Float8Linear",
    "NVFP4Packed",
    "Precision",
    "PrecisionRequest",
    "QuantBackend",
    "QuantConv1x1",
    "QuantLinear",
    "build_engine",
    "choose_engine",
    "device_facts",
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
    "torchao_available",
    "weight_tensors",
]
