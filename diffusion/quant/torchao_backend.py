"""The ``torchao`` backend: real FP8 GEMMs (``torch._scaled_mm``) with torchao's ``Float8Tensor``.

This is the engine of ``precision: fp8`` on the GPUs most users have, Hopper (sm_90) and Ada (sm_89),
and on Blackwell the one for FP8: the weights are held in E4M3 with a scale per output channel, each input
is quantized to E4M3 with a dynamic scale per row (token) on every call, and the GEMM runs on the FP8
tensor cores — torchao's ``PerRow`` granularity, the one its ``Float8DynamicActivationFloat8WeightConfig``
recommends for accuracy, and the one under which a candidate's result does not depend on its batchmates.
``precision: fp8_tensor`` is its ``PerTensor`` (one scale for the weight, one per call for the input). The
FP8 codes and scales are the project's (:mod:`diffusion.quant.precision`) for both, so in float32 the layer
agrees with the ``project`` backend's fake-quantized one to fp32 rounding (tested on CPU, where
``torch._scaled_mm`` has a reference kernel).

The weight is the ``Float8Tensor`` that ``quantize_(model, Float8DynamicActivationFloat8WeightConfig(...))``
puts in a Linear, built from the same config object's fields (``_float8_weight``), not through ``quantize_``
itself: ``quantize_`` asserts an sm_89+ GPU (so it cannot run in the CPU suite), takes only bfloat16 weights
for ``PerRow``, and replaces the Parameter that weight sync writes into. Building the tensor from the config
keeps the engine's own high-precision weight and its in-place refresh.

Why torchao rather than Transformer Engine's FP8 recipes (the choice is written down in
``docs/gpu.md``):

* install: a 3 MB ``pip install torchao`` beside any torch build, and its FP8 path is Python over
  ``torch._scaled_mm``; TE's PyTorch extension builds from source against a CUDA toolkit and cuDNN;
* weight sync: the FP8 weight is computed once per sync (:meth:`Float8Gemm.refresh`, written into the
  existing tensors, so a ``torch.compile``-d engine is not recompiled); TE's current scaling
  re-quantizes every weight on every forward;
* ``torch.compile``: torchao's tensor subclass is built for it (the activation quantization fuses
  into the preceding kernel); TE modules are opaque to the compiler;
* rank fidelity: identical formats (E4M3, per-tensor scales) in both; the project's CPU numbers apply.

Which layers: the layer rule (:mod:`diffusion.quant.layer_rule`), less those whose GEMM dims are not
multiples of 16 (``torch._scaled_mm``'s requirement). The official engine builds its layers the same
way for TE (NVlabs/Sana ``train_scripts/train_utils.py``, ``replace_linear_with_te``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Collection, Sequence
from contextlib import AbstractContextManager
from types import ModuleType
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from diffusion.quant.precision import FP8_PRECISIONS, Precision
from diffusion.quant.project_backend import QuantConv1x1, QuantLinear, gemm_dims

# torch._scaled_mm needs both GEMM dims to be multiples of 16.
FP8_DIM_MULTIPLE = 16


@functools.cache
def _torchao() -> ModuleType | None:
    try:
        import torchao.quantization as torchao_quantization
    except ImportError:
        return None
    return torchao_quantization


def torchao_available() -> bool:
    """Whether torchao's ``Float8Tensor`` imports here."""
    return _torchao() is not None


def float8_config(precision: Precision):
    """torchao's public ``Float8DynamicActivationFloat8WeightConfig`` of ``precision``: ``PerRow`` for ``fp8``,
    ``PerTensor`` for ``fp8_tensor``; fast accumulation; ``torch._scaled_mm`` as the kernel (the one that
    exists for both granularities on CPU and GPU)."""
    ao = _torchao()
    if ao is None:
        raise RuntimeError("backend='torchao' needs torchao (pip install torchao); use backend='project'")
    from torchao.quantization.quantize_.common import KernelPreference  # not exported by torchao.quantization

    granularity = {"fp8": ao.PerRow, "fp8_tensor": ao.PerTensor}[precision]()
    return ao.Float8DynamicActivationFloat8WeightConfig(
        granularity=granularity, mm_config=ao.Float8MMConfig(use_fast_accum=True),
        kernel_preference=KernelPreference.TORCH)


def _float8_weight(weight: torch.Tensor, precision: Precision) -> torch.Tensor:
    """The ``Float8Tensor`` of the ``[out, in]`` ``weight`` that ``quantize_`` builds for ``float8_config
    (precision)`` (its ``_float8_dynamic_activation_float8_weight_quantize_tensor``, PLAIN packing): the
    weight's codes and scales, and the dynamic quantization of every input it multiplies."""
    ao = _torchao()
    from torchao.quantization.quantize_.workflows.float8.float8_tensor import QuantizeTensorToFloat8Kwargs

    config = float8_config(precision)
    activation, weight_granularity = config.granularity  # normalised to [activation, weight] by the config
    act_quant_kwargs = QuantizeTensorToFloat8Kwargs(config.activation_dtype, activation,
                                                    hp_value_lb=config.activation_value_lb,
                                                    hp_value_ub=config.activation_value_ub,
                                                    kernel_preference=config.kernel_preference)
    return ao.Float8Tensor.from_hp(weight, float8_dtype=config.weight_dtype, granularity=weight_granularity,
                                   mm_config=config.mm_config, kernel_preference=config.kernel_preference,
                                   act_quant_kwargs=act_quant_kwargs)


class Float8Gemm:
    """A project layer (:class:`QuantLinear` / :class:`QuantConv1x1`) whose GEMM is a real FP8 one.

    ``weight`` stays the high-precision Parameter (what weight sync writes into); ``weight_fq`` holds
    its ``Float8Tensor`` (E4M3 data and scale), recomputed by :meth:`refresh` into the same storage.
    """

    backend: ClassVar[str] = "torchao"
    weight_fq: torch.Tensor

    @torch.no_grad()
    def refresh(self) -> None:
        """Quantize the current weight; after the first time, into the existing FP8 data and scale."""
        weight = self._gemm_weight()
        self.weight_amax = weight.abs().amax().float()
        fresh = _float8_weight(weight, self.precision)
        current = self.weight_fq
        if type(current) is type(fresh) and current.qdata.shape == fresh.qdata.shape:
            current.qdata.copy_(fresh.qdata)
            current.scale.copy_(fresh.scale)
        else:
            self.weight_fq = fresh

    def adopt_quantized(self) -> None:
        raise ValueError("FP8 engines take dense weights; only NVFP4 layers adopt prequantized ones")

    def _gemm(self, rows: torch.Tensor) -> torch.Tensor:
        return F.linear(rows.contiguous(), self.weight_fq, self.bias)


class Float8Linear(Float8Gemm, QuantLinear):
    """``nn.Linear`` computed as ``e4m3(x)·e4m3(W)ᵀ`` by ``torch._scaled_mm`` (per-row or per-tensor scales)."""


class Float8Conv1x1(Float8Gemm, QuantConv1x1):
    """A 1×1 ``nn.Conv2d`` computed as a real FP8 Linear over channels."""


class TorchaoBackend:
    """The ``torchao`` backend (see the module docstring): ``fp8`` only, GEMM dims multiples of 16."""

    name = "torchao"

    def supports(self, module: nn.Module) -> bool:
        d_in, d_out = gemm_dims(module)
        return not (d_in % FP8_DIM_MULTIPLE or d_out % FP8_DIM_MULTIPLE)

    def quantize(
        self,
        engine: nn.Module,
        linears: Sequence[str],
        convs: Sequence[str],
        precision: Precision,
        block_size: int = 16,
    ) -> nn.Module:
        if precision not in FP8_PRECISIONS:
            raise ValueError(f"backend 'torchao' runs precision='fp8' or 'fp8_tensor' only, got {precision!r}")
        for name in (*linears, *convs):
            old = engine.get_submodule(name)
            layer = (Float8Conv1x1 if isinstance(old, nn.Conv2d) else Float8Linear)(old, precision)
            if not name:
                return layer
            engine.set_submodule(name, layer)
        return engine

    def refresh(self, engine: nn.Module, prequantized: Collection[str] = ()) -> None:
        for module in engine.modules():
            if isinstance(module, Float8Gemm):
                module.refresh()

    def is_quantized(self, module: nn.Module) -> bool:
        return isinstance(module, Float8Gemm)

    def runtime(self) -> AbstractContextManager[None]:
        return contextlib.nullcontext()


TORCHAO = TorchaoBackend()
