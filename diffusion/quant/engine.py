"""Low-precision rollout engines: a deep copy of a model whose eligible layers run quantized.

"FP4 explore, BF16 train": the learner keeps the high-precision policy; actors sample with an engine
built by :func:`build_engine` from the layers :func:`engine_layers` picks (``diffusion.explore.ExploreEngine``
does both, from the model family and the config) and receive new weights through :func:`load_weights`.
Which layers: :mod:`diffusion.quant.layer_rule`; how they run: the backend (:mod:`diffusion.quant.backends`).

Calling an engine runs its forward inside its backend's runtime context (TE's FP4 autocast for
``te``, nothing for the others), as the official engine does with ``wrap_forward_with_fp8``
(NVlabs/Sana ``train_scripts/train_utils.py``): an engine cannot be run by mistake outside it.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from diffusion.quant.backends import REGISTRY, get_backend
from diffusion.quant.layer_rule import EligibleLayers, eligible_layers
from diffusion.quant.precision import QUANTIZED_PRECISIONS, Precision, check_precision


class _ForwardInRuntime:
    """An engine's ``forward``: the class's forward, run inside the runtime context of ``backend``.

    Set as the instance attribute ``forward``, so ``state_dict`` keys are unchanged and ``engine(...)``
    (hooks included) goes through it. It holds the module itself rather than its bound method, so a
    deep copy of the engine calls the copy.
    """

    def __init__(self, module: nn.Module, backend: str) -> None:
        self.module = module
        self.backend = backend

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with get_backend(self.backend).runtime():
            return type(self.module).forward(self.module, *args, **kwargs)


def engine_layers(
    model: nn.Module, backend: str, *, skip: Sequence[str] = (), min_dim: int = 0, conv1x1: bool = False
) -> EligibleLayers:
    """The layers an engine of ``model`` on the concrete ``backend`` runs quantized: the layer rule's,
    less those the backend cannot run (TE: GEMM dims not multiples of 16)."""
    supports = get_backend(backend).supports
    eligible = eligible_layers(model, skip=skip, min_dim=min_dim, conv1x1=conv1x1)
    return EligibleLayers(
        tuple(name for name in eligible.linears if supports(model.get_submodule(name))),
        tuple(name for name in eligible.convs if supports(model.get_submodule(name))),
    )


def build_engine(
    model: nn.Module,
    precision: Precision,
    backend: str,
    *,
    linears: Sequence[str],
    convs: Sequence[str] = (),
    block_size: int = 16,
    in_place: bool = False,
) -> nn.Module:
    """A deep copy of ``model`` whose named layers run quantized on the concrete ``backend`` (not
    checked against the device: see :func:`resolve_backend`), every forward inside its runtime.

    ``in_place``: quantize ``model`` itself instead of a copy (it becomes the engine; use the returned
    module, which differs from ``model`` only when ``model`` is itself the one quantized layer)."""
    check_precision(precision, QUANTIZED_PRECISIONS)
    target = model if in_place else copy.deepcopy(model)
    engine = get_backend(backend).quantize(target, linears, convs, precision, block_size)
    engine.forward = _ForwardInRuntime(engine, backend)
    return engine


def refresh_quantizers(engine: nn.Module, *, prequantized: Collection[str] = ()) -> None:
    """Recompute every quantizer's amax/scales and cached weights from the current weights.

    Each backend refreshes its own layers: project layers recompute their fake-quantized weight (or
    adopt it when its key is in ``prequantized``), modelopt resets its weight amax and re-calibrates
    without data, TE has nothing to do (it quantizes every forward).
    """
    for backend in REGISTRY.values():
        backend.refresh(engine, prequantized)


def _is_quantizer_state(key: str) -> bool:
    # modelopt stores amax under "<layer>.<weight|input|output>_quantizer.*"; TE adds "_extra_state".
    components = key.split(".")
    return components[-1] == "_extra_state" or any(part.endswith("_quantizer") for part in components)


def weight_tensors(engine: nn.Module) -> dict[str, torch.Tensor]:
    """The engine's loadable tensors by ``state_dict`` key: parameters and persistent buffers,
    excluding quantizer state (the keys a high-precision copy of the policy has)."""
    return {
        key: tensor
        for key, tensor in engine.state_dict(keep_vars=True).items()
        if isinstance(tensor, torch.Tensor) and not _is_quantizer_state(key)
    }


def _as_tensor(key: str, value: torch.Tensor | np.ndarray) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        # from_numpy warns about read-only arrays (e.g. wrapping a received buffer); they are only read.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(value)
    raise TypeError(
        f"load_weights: {key!r} is a {type(value).__name__}, expected a torch.Tensor or numpy.ndarray"
    )


@torch.no_grad()
def load_weights(
    engine: nn.Module,
    state: Mapping[str, torch.Tensor | np.ndarray],
    *,
    strict: bool = True,
    prequantized: Collection[str] = (),
) -> None:
    """Copy ``state`` into the engine's existing tensors in place, then :func:`refresh_quantizers`.

    Every entry is validated (known key, same shape, same dtype) before anything is copied, so a bad
    state leaves the engine unchanged. ``strict=False`` allows a partial state. Weights named in
    ``prequantized`` already hold NVFP4 fake-quantized values and are used as they are.
    """
    targets = weight_tensors(engine)
    sources: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key not in targets:
            raise KeyError(f"load_weights: unknown key {key!r}; the engine has no such weight")
        source = _as_tensor(key, value)
        target = targets[key]
        if source.shape != target.shape:
            raise ValueError(
                f"load_weights: {key!r} has shape {tuple(source.shape)}, expected {tuple(target.shape)}"
            )
        if source.dtype != target.dtype:
            raise ValueError(f"load_weights: {key!r} has dtype {source.dtype}, expected {target.dtype}")
        sources[key] = source
    if strict:
        missing = sorted(targets.keys() - sources.keys())
        if missing:
            raise KeyError(
                f"load_weights: state lacks {len(missing)} key(s), e.g. {missing[:5]} (strict=True)"
            )
    for key, source in sources.items():
        targets[key].data.copy_(source)
    refresh_quantizers(engine, prequantized=prequantized)
