"""The ``modelopt`` backend: nvidia-modelopt's fake quantizers (its NVFP4 kernels need CUDA).

``mtq.quantize`` with the NVFP4 / W4A16-NVFP4 / FP8 preset, reduced to its format entries: the
engine's layer rule alone decides which layers are quantized, so modelopt's model-family exclusions
(such as ``*proj_out.*``) are not applied. Weights are max-calibrated without data, so the activation
amax is dynamic, as in the project backend (modelopt's usual PTQ flow calibrates a static one).

1×1 convolutions run as the project's :class:`~diffusion.quant.project_backend.QuantConv1x1`: modelopt's
``QuantConv2d`` blocks NVFP4 along the last dim of the ``[out, in, 1, 1]`` weight (size 1) and along
the input's width, not along channels as the official engine's Linear over channels does.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Collection, Sequence
from contextlib import AbstractContextManager

from torch import nn

from diffusion.quant.precision import Precision
from diffusion.quant.project_backend import PROJECT

_PRESETS = {
    "nvfp4": "NVFP4_DEFAULT_CFG",
    "nvfp4_w4a16": "W4A16_NVFP4_CFG",
    "fp8": "FP8_PER_CHANNEL_PER_TOKEN_CFG",  # weights per output channel, inputs per token (dynamic)
    "fp8_tensor": "FP8_DEFAULT_CFG",
}


def modelopt_quantize(engine: nn.Module, linears: Sequence[str], precision: Precision) -> nn.Module:
    """Quantize exactly the Linears named ``linears`` of ``engine`` in place with modelopt's preset."""
    if not linears:
        return engine
    import modelopt.torch.quantization as mtq

    config = copy.deepcopy(getattr(mtq, _PRESETS[precision]))
    # Keep only the format entries (what to quantize and how); the layer rule decides which layers.
    config["quant_cfg"] = [{"quantizer_name": "*", "enable": False}] + [
        entry for entry in config["quant_cfg"] if entry.get("enable", True) and "parent_class" not in entry
    ]
    # Calibrate only once the quantizers of non-eligible modules are off.
    config["algorithm"] = None
    mtq.quantize(engine, config, forward_loop=None)
    eligible = set(linears)
    mtq.disable_quantizer(engine, lambda quantizer_name: quantizer_name.rpartition(".")[0] not in eligible)
    modelopt_calibrate(engine)
    return engine


def modelopt_calibrate(engine: nn.Module) -> None:
    """Recompute every enabled weight quantizer's amax from the current weights (no data)."""
    import modelopt.torch.quantization as mtq

    # The max calibrator keeps a running max across calibrations: without the reset a refreshed
    # amax would be max(old, new), i.e. stale whenever the weights shrink.
    for name, module in engine.named_modules():
        if name.endswith("weight_quantizer") and module.is_enabled:
            module.reset_amax()
    mtq.calibrate(engine, algorithm="max", forward_loop=None)


def _uses_modelopt(engine: nn.Module) -> bool:
    return any(hasattr(module, "weight_quantizer") for module in engine.modules())


class ModeloptBackend:
    """The ``modelopt`` backend (see the module docstring); block size 16 only."""

    name = "modelopt"

    def supports(self, module: nn.Module) -> bool:
        return True

    def quantize(
        self,
        engine: nn.Module,
        linears: Sequence[str],
        convs: Sequence[str],
        precision: Precision,
        block_size: int = 16,
    ) -> nn.Module:
        if block_size != 16:
            raise ValueError(f"backend 'modelopt' supports block_size=16 only, got {block_size}")
        # Linears first: mtq.quantize converts every nn.Conv2d too (its quantizers then disabled), and
        # the project layers below take over the converted convs' Parameters.
        engine = modelopt_quantize(engine, linears, precision)
        return PROJECT.quantize(engine, (), convs, precision, block_size)

    def refresh(self, engine: nn.Module, prequantized: Collection[str] = ()) -> None:
        # modelopt re-derives its scales from the weights it holds; prequantized values are re-quantized.
        if _uses_modelopt(engine):
            modelopt_calibrate(engine)

    def is_quantized(self, module: nn.Module) -> bool:
        weight_quantizer = getattr(module, "weight_quantizer", None)
        return weight_quantizer is not None and bool(weight_quantizer.is_enabled)

    def runtime(self) -> AbstractContextManager[None]:
        return contextlib.nullcontext()


MODELOPT = ModeloptBackend()
