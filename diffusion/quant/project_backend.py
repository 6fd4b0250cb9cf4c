"""The ``project`` backend: fake quantization with this package's bit-exact NVFP4/FP8 functions.

Runs on any device (the CPU default). Each replaced layer caches its fake-quantized weight (computed
once per weight load) and fake-quantizes its input on every call (see
:mod:`diffusion.quant.precision`). A 1×1 convolution runs as the official engine runs it, a Linear
over channels (NVlabs/Sana ``train_scripts/train_utils.py``, ``BF16TEConv1x1AsLinear``): the NCHW input
is read as ``[B, H·W, C]`` rows, so its NVFP4 blocks run along channels, and the ``[out, in, 1, 1]``
weight as ``[out, in]``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Sequence
from contextlib import AbstractContextManager
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from diffusion.quant.precision import (
    FP8_PRECISIONS,
    QUANTIZED_PRECISIONS,
    Precision,
    check_precision,
    quantize_input,
    quantize_weight,
)


class _FakeQuantGemm(nn.Module):
    """The cached fake-quantized GEMM weight shared by :class:`QuantLinear` and :class:`QuantConv1x1`.

    ``weight_fq`` (the fake-quantized ``weight.reshape(out, -1)``) and ``weight_amax`` (the FP32
    ``max|W|`` it was computed with) are non-persistent buffers, so ``state_dict()`` keys stay those of
    the unquantized layer. Both go stale when the weight changes: call :meth:`refresh`
    (``load_weights`` does).
    """

    backend: ClassVar[str] = "project"  # the backend that refreshes (and counts) this layer
    weight: nn.Parameter
    bias: nn.Parameter | None
    weight_fq: torch.Tensor
    weight_amax: torch.Tensor
    precision: Precision
    block_size: int

    def _init_quant(self, precision: Precision, block_size: int) -> None:
        check_precision(precision, QUANTIZED_PRECISIONS)
        self.precision = precision
        self.block_size = block_size
        self.register_buffer("weight_fq", torch.empty(0), persistent=False)
        self.register_buffer("weight_amax", torch.empty(0), persistent=False)
        self.refresh()

    def _gemm_weight(self) -> torch.Tensor:
        weight = self.weight.detach()
        return weight.reshape(weight.shape[0], -1)

    @torch.no_grad()
    def refresh(self) -> None:
        """Recompute ``weight_amax`` and ``weight_fq`` from the current weight."""
        weight = self._gemm_weight()
        self.weight_amax = weight.abs().amax().float()
        self.weight_fq = quantize_weight(weight, self.precision, self.block_size)

    @torch.no_grad()
    def adopt_quantized(self) -> None:
        """Take the current weight as already fake-quantized (an NVFP4 snapshot decoded by the explorer).

        Re-quantizing decoded NVFP4 values is not always the identity in FP32 (the tensor scale can move
        by one ulp), so values that arrive quantized are used as they are, bit for bit.
        """
        if self.precision in FP8_PRECISIONS:
            raise ValueError("adopt_quantized is for NVFP4 layers; FP8 engines take dense weights")
        weight = self._gemm_weight()
        self.weight_amax = weight.abs().amax().float()
        self.weight_fq = weight.clone()

    def _gemm(self, rows: torch.Tensor) -> torch.Tensor:
        """``quantize_input(rows) @ weight_fqᵀ + bias`` for ``rows`` of shape ``[..., in]``."""
        return F.linear(quantize_input(rows, self.precision, self.block_size), self.weight_fq, self.bias)


class QuantLinear(_FakeQuantGemm, nn.Linear):
    """``nn.Linear`` whose forward uses the fake-quantized weight (and, for W4A4/FP8, input).

    Takes over the original ``weight``/``bias`` Parameters under their names (nothing is reallocated).
    """

    def __init__(self, linear: nn.Linear, precision: Precision, block_size: int = 16) -> None:
        # Built on the meta device, then handed the existing Parameters.
        nn.Linear.__init__(
            self,
            linear.in_features,
            linear.out_features,
            bias=linear.bias is not None,
            device="meta",
            dtype=linear.weight.dtype,
        )
        self.weight = linear.weight
        self.bias = linear.bias
        self._init_quant(precision, block_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._gemm(x)

    def extra_repr(self) -> str:
        return f"{nn.Linear.extra_repr(self)}, precision={self.precision}"


class QuantConv1x1(_FakeQuantGemm, nn.Conv2d):
    """A 1×1 ``nn.Conv2d`` run as a fake-quantized Linear over channels.

    ``y[b, :, i, j] = quantize_input(x[b, :, i, j] over all pixels) @ weight_fqᵀ + bias`` with
    ``weight_fq`` the fake-quantized ``weight.reshape(out, in)``; the layer's ``weight`` keeps its
    ``[out, in, 1, 1]`` shape and name.
    """

    def __init__(self, conv: nn.Conv2d, precision: Precision, block_size: int = 16) -> None:
        if conv.kernel_size != (1, 1) or conv.stride != (1, 1) or conv.groups != 1:
            raise ValueError(
                f"QuantConv1x1 needs kernel 1x1, stride 1x1 and groups 1, got kernel {conv.kernel_size}, "
                f"stride {conv.stride}, groups {conv.groups}"
            )
        nn.Conv2d.__init__(
            self,
            conv.in_channels,
            conv.out_channels,
            kernel_size=1,
            bias=conv.bias is not None,
            device="meta",
            dtype=conv.weight.dtype,
        )
        self.weight = conv.weight
        self.bias = conv.bias
        self._init_quant(precision, block_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4:
            raise ValueError(f"QuantConv1x1 expects an NCHW input, got shape {tuple(x.shape)}")
        batch, _, height, width = x.shape
        rows = x.flatten(2).transpose(1, 2)  # [B, H·W, C]: NVFP4 blocks then run along channels
        return self._gemm(rows).transpose(1, 2).reshape(batch, -1, height, width)

    def extra_repr(self) -> str:
        return f"{nn.Conv2d.extra_repr(self)}, precision={self.precision}"


def gemm_dims(module: nn.Module) -> tuple[int, int]:
    """``(in, out)`` of a Linear or of a 1×1 convolution seen as a Linear over channels."""
    if isinstance(module, nn.Conv2d):
        return module.in_channels, module.out_channels
    return module.in_features, module.out_features


def project_layer(module: nn.Module, precision: Precision, block_size: int = 16) -> QuantLinear | QuantConv1x1:
    """The project backend's replacement for an eligible ``nn.Linear`` or 1×1 ``nn.Conv2d``."""
    if isinstance(module, nn.Linear):
        return QuantLinear(module, precision, block_size)
    if isinstance(module, nn.Conv2d):
        return QuantConv1x1(module, precision, block_size)
    raise TypeError(f"cannot quantize a {type(module).__name__}; expected nn.Linear or a 1x1 nn.Conv2d")


def _weight_key(name: str) -> str:
    """The ``state_dict`` key of the weight of the layer ``name`` (``""``: the engine is that layer)."""
    return f"{name}.weight" if name else "weight"


def refresh_project_layers(engine: nn.Module, prequantized: Collection[str] = ()) -> None:
    """Refresh every project layer of ``engine``; those whose ``<name>.weight`` is in ``prequantized``
    adopt their (already fake-quantized) weight as it is."""
    for name, module in engine.named_modules():
        if isinstance(module, _FakeQuantGemm) and module.backend == "project":
            if _weight_key(name) in prequantized:
                module.adopt_quantized()
            else:
                module.refresh()


class ProjectBackend:
    """The ``project`` backend (see the module docstring); any block size, any device."""

    name = "project"

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
        for name in (*linears, *convs):
            layer = project_layer(engine.get_submodule(name), precision, block_size)
            if not name:  # the engine is this one layer
                return layer
            engine.set_submodule(name, layer)
        return engine

    def refresh(self, engine: nn.Module, prequantized: Collection[str] = ()) -> None:
        refresh_project_layers(engine, prequantized)

    def is_quantized(self, module: nn.Module) -> bool:
        return isinstance(module, _FakeQuantGemm) and module.backend == "project"

    def runtime(self) -> AbstractContextManager[None]:
        return contextlib.nullcontext()


PROJECT = ProjectBackend()
