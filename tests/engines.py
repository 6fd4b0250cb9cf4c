"""Low-precision engines of bare modules, built the way an explorer builds its own.

`quantize` runs `diffusion.explore.ExploreEngine` on a stand-in policy (the module as its transformer, the
given layer rule as its family's), so what the tests check of an engine is what explorers sample with.
`quantized_layer_names` and `runtime_backend` read back what an engine really became.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

from torch import nn

from diffusion.config import ExploreConfig
from diffusion.explore import ExploreEngine
from diffusion.families import QuantPolicy
from diffusion.quant import Backend, Precision
from diffusion.quant.backends import REGISTRY


def stand_in_policy(model: nn.Module, *, skip: Sequence[str] = (), min_dim: int = 0,
                    conv1x1: bool = False) -> SimpleNamespace:
    """What `ExploreEngine` reads of a policy: its transformer and its family's layer rule."""
    return SimpleNamespace(transformer=model, family=SimpleNamespace(
        quant=QuantPolicy(skip=tuple(skip), min_dim=min_dim, conv1x1=conv1x1)))


def quantize(model: nn.Module, precision: Precision, *, skip: Sequence[str] = (), min_dim: int = 0,
             conv1x1: bool = False, backend: Backend = "auto") -> nn.Module:
    """The explorer's engine of `model` (`ExploreEngine(...).module`); `model` is untouched."""
    policy = stand_in_policy(model, skip=skip, min_dim=min_dim, conv1x1=conv1x1)
    return ExploreEngine(policy, ExploreConfig(precision=precision, backend=backend, allow_emulation=True)).module


def quantized_layer_names(engine: nn.Module) -> list[str]:
    """Qualified names of the layers of `engine` that run quantized, whatever the backend."""
    return [name for name, module in engine.named_modules()
            if any(backend.is_quantized(module) for backend in REGISTRY.values())]


def runtime_backend(engine: nn.Module) -> str | None:
    """The backend whose runtime context `engine`'s forward enters; None for a plain model."""
    return getattr(engine.__dict__.get("forward"), "backend", None)
