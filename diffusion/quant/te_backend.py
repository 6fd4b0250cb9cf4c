"""Transformer Engine backend: real NVFP4 GEMMs on Blackwell GPUs.

Transformer Engine is an optional dependency (the ``te`` extra). Importing it on a machine without
CUDA raises ``RuntimeError`` rather than ``ImportError``, so the import guard catches both and every
entry point here reports a missing TE as one clear error.

A model whose layers were swapped by :func:`swap_to_te_linear` runs in NVFP4 only inside
:func:`fp4_autocast`; outside it TE Linear computes in the parameters' precision. TE quantizes the
high-precision weights on every forward, so loading new weights needs no refresh step.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, Iterator
from types import ModuleType

import torch
from torch import nn

# TE's FP8/FP4 GEMMs need both Linear dims to be multiples of 16.
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
    """Whether ``module`` is a ``transformer_engine.pytorch.Linear`` (checked without importing TE)."""
    cls = type(module)
    return cls.__name__ == "Linear" and cls.__module__.startswith("transformer_engine.")


def swap_to_te_linear(model: nn.Module, eligible_names: Iterable[str]) -> nn.Module:
    """Replace each named ``nn.Linear`` of ``model`` in place by a ``te.pytorch.Linear`` with copied
    weights; returns ``model`` (or the new layer when the name is ``""``, i.e. ``model`` itself).
    Parameter names stay ``weight``/``bias``."""
    te = _require_te()
    for name in eligible_names:
        old = model.get_submodule(name)
        if old.in_features % TE_DIM_MULTIPLE or old.out_features % TE_DIM_MULTIPLE:
            raise ValueError(
                f"{name}: TE needs Linear dims that are multiples of {TE_DIM_MULTIPLE}, got "
                f"{old.in_features}x{old.out_features}; skip it or use backend='project'"
            )
        new = te.Linear(
            old.in_features,
            old.out_features,
            bias=old.bias is not None,
            params_dtype=old.weight.dtype,
            device=old.weight.device,
        )
        with torch.no_grad():
            new.weight.copy_(old.weight)
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
