"""The ``te`` backend: real NVFP4 GEMMs with Transformer Engine on Blackwell GPUs.

Transformer Engine is an optional dependency (the ``te`` extra). Importing it on a machine without
CUDA raises ``RuntimeError`` rather than ``ImportError``, so the import guard catches both and every
entry point here reports a missing TE as one clear error.

As in the official engine (NVlabs/Sana ``train_scripts/train_utils.py``: ``replace_linear_with_te``,
``BF16TEConv1x1AsLinear``, ``wrap_forward_with_fp8``), eligible Linears become ``te.pytorch.Linear``,
eligible 1×1 convolutions become a ``te.pytorch.Linear`` run over the channels of the NCHW input, and
the engine's whole forward runs inside TE's FP4 autocast (:func:`fp4_autocast`, the backend's runtime
context, entered by the engine itself): outside it ``te.Linear`` computes in the parameters' precision.
TE quantizes the high-precision weights on every forward, so loading new weights needs no refresh.

The recipe is TE's documented NVFP4 one, ``NVFP4BlockScaling`` (16-element blocks with E4M3 scales,
the format this project's `nvfp4` numerics reproduce). The official script builds
``DelayedScaling(fp8_format=Format.E2M1)`` instead; which GEMMs TE then runs has not been checked on
Blackwell hardware here.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from types import ModuleType
from typing import Any

import torch
from torch import nn

from diffusion.quant.precision import Precision
from diffusion.quant.project_backend import gemm_dims

# TE's FP8/FP4 GEMMs need both GEMM dims to be multiples of 16.
TE_DIM_MULTIPLE = 16

_MISSING_TE = (
    "Transformer Engine is not usable here: it must be installed (pip install 'sol-rl[te]') and "
    "needs a CUDA GPU; use backend='project' (any device) or 'modelopt' (CUDA) instead"
)


@functools.cache
def _te_pytorch() -> ModuleType | None:
    try:
        import transformer_engine.pytorch as te_pytorch
    except (ImportError, RuntimeError):
        return None
    return te_pytorch


def te_available() -> bool:
    """Whether ``transformer_engine.pytorch`` imports on this machine."""
    return _te_pytorch() is not None


def is_blackwell() -> bool:
    """Whether the current CUDA device is a Blackwell GPU (compute capability 10.x or 12.x)."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] in (10, 12)


def _require_te() -> ModuleType:
    te = _te_pytorch()
    if te is None:
        raise RuntimeError(_MISSING_TE)
    return te


def is_te_linear(module: nn.Module) -> bool:
    """Whether ``module`` is (a subclass of) ``transformer_engine.pytorch.Linear``, checked without
    importing TE."""
    return any(
        cls.__name__ == "Linear" and cls.__module__.startswith("transformer_engine.") for cls in type(module).__mro__
    )


@functools.cache
def _te_conv1x1_class(te_linear: type) -> type:
    """A ``te_linear`` subclass that runs a 1×1 convolution as a Linear over channels.

    Its ``state_dict`` shows the weight as the convolution's ``[out, in, 1, 1]`` (a view of TE's
    ``[out, in]`` parameter), so keys and shapes equal the unquantized model's and weight loading
    writes straight into TE's parameter.
    """

    class TEConv1x1(te_linear):  # type: ignore[misc, valid-type]
        def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            batch, _, height, width = x.shape
            rows = x.flatten(2).transpose(1, 2).contiguous()  # [B, H·W, C]
            out = super().forward(rows, *args, **kwargs)
            return out.transpose(1, 2).reshape(batch, -1, height, width)

        def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
            super()._save_to_state_dict(destination, prefix, keep_vars)
            key = f"{prefix}weight"
            destination[key] = destination[key].view(self.out_features, self.in_features, 1, 1)

        def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any) -> None:
            key = f"{prefix}weight"
            if key in state_dict and state_dict[key].dim() == 4:
                state_dict[key] = state_dict[key].reshape(self.out_features, self.in_features)
            super()._load_from_state_dict(state_dict, prefix, *args)

    TEConv1x1.__qualname__ = TEConv1x1.__name__ = "TEConv1x1"
    return TEConv1x1


def swap_to_te_linear(model: nn.Module, eligible_names: Iterable[str]) -> nn.Module:
    """Replace each named ``nn.Linear`` (or 1×1 ``nn.Conv2d``) of ``model`` in place by a
    ``te.pytorch.Linear`` (run over channels for a convolution) with copied weights; returns ``model``
    (or the new layer when the name is ``""``, i.e. ``model`` itself). Parameter names stay
    ``weight``/``bias``."""
    te = _require_te()
    for name in eligible_names:
        old = model.get_submodule(name)
        d_in, d_out = gemm_dims(old)
        if d_in % TE_DIM_MULTIPLE or d_out % TE_DIM_MULTIPLE:
            raise ValueError(
                f"{name}: TE needs GEMM dims that are multiples of {TE_DIM_MULTIPLE}, got {d_in}x{d_out}; "
                "skip it or use backend='project'"
            )
        cls = _te_conv1x1_class(te.Linear) if isinstance(old, nn.Conv2d) else te.Linear
        new = cls(d_in, d_out, bias=old.bias is not None, params_dtype=old.weight.dtype, device=old.weight.device)
        with torch.no_grad():
            new.weight.copy_(old.weight.reshape(d_out, d_in))
            if old.bias is not None:
                new.bias.copy_(old.bias)
        if not name:
            return new
        model.set_submodule(name, new)
    return model


@contextlib.contextmanager
def fp4_autocast() -> Iterator[None]:
    """Run TE modules inside with the ``NVFP4BlockScaling`` recipe (W4A4 NVFP4 GEMMs)."""
    te = _require_te()
    from transformer_engine.common.recipe import NVFP4BlockScaling

    recipe = NVFP4BlockScaling()
    # TE 2.x renamed fp8_autocast(fp8_recipe=...) to autocast(recipe=...); support both.
    autocast = getattr(te, "autocast", None)
    context = (
        autocast(enabled=True, recipe=recipe)
        if autocast is not None
        else te.fp8_autocast(enabled=True, fp8_recipe=recipe)
    )
    with context:
        yield


class TEBackend:
    """The ``te`` backend (see the module docstring): ``nvfp4`` only, block size 16, GEMM dims that are
    multiples of 16 (other eligible layers stay in high precision)."""

    name = "te"

    def supports(self, module: nn.Module) -> bool:
        d_in, d_out = gemm_dims(module)
        return not (d_in % TE_DIM_MULTIPLE or d_out % TE_DIM_MULTIPLE)

    def quantize(
        self,
        engine: nn.Module,
        linears: Sequence[str],
        convs: Sequence[str],
        precision: Precision,
        block_size: int = 16,
    ) -> nn.Module:
        if precision != "nvfp4" or block_size != 16:
            raise ValueError(
                f"backend 'te' runs precision='nvfp4' with block_size=16 only, got {precision!r}, {block_size}"
            )
        return swap_to_te_linear(engine, (*linears, *convs))

    def refresh(self, engine: nn.Module, prequantized: Collection[str] = ()) -> None:
        """Nothing to do: TE quantizes the current weights on every forward."""

    def is_quantized(self, module: nn.Module) -> bool:
        return is_te_linear(module)

    def runtime(self) -> AbstractContextManager[None]:
        return fp4_autocast()


TE = TEBackend()
