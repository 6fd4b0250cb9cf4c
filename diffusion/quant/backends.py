"""The quantization backends, by name, and the choice of one for a model on a device.

============  ==========================================================  =============================
backend       layers                                                      runtime context per forward
============  ==========================================================  =============================
``project``   :class:`QuantLinear` / :class:`QuantConv1x1` (any device)  none
``modelopt``  modelopt quantizers on Linears (CUDA), project 1×1 convs    none
``te``        ``te.pytorch.Linear`` (Blackwell GPU, ``nvfp4`` only)       TE's FP4 autocast
============  ==========================================================  =============================

``auto`` picks ``te`` for ``nvfp4`` on a Blackwell GPU with Transformer Engine, ``modelopt`` on other
CUDA devices and ``project`` elsewhere.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from contextlib import AbstractContextManager
from typing import Literal, Protocol, get_args

import torch
from torch import nn

from diffusion.quant.modelopt_backend import MODELOPT
from diffusion.quant.precision import Precision
from diffusion.quant.project_backend import PROJECT
from diffusion.quant.te_backend import TE, is_blackwell, te_available

Backend = Literal["auto", "project", "modelopt", "te"]
BACKENDS: tuple[str, ...] = get_args(Backend)


class QuantBackend(Protocol):
    """What a backend does to an engine: replace layers, refresh them, and run every forward."""

    name: str

    def supports(self, module: nn.Module) -> bool:
        """Whether the backend can run this eligible layer quantized (else it stays high precision)."""

    def quantize(
        self,
        engine: nn.Module,
        linears: Sequence[str],
        convs: Sequence[str],
        precision: Precision,
        block_size: int = 16,
    ) -> nn.Module:
        """Replace the named layers of ``engine`` in place; returns ``engine`` (or the new layer when
        a name is ``""``)."""

    def refresh(self, engine: nn.Module, prequantized: Collection[str] = ()) -> None:
        """Recompute the backend's cached scales/weights from the current weights; a no-op for an
        engine without this backend's layers. ``prequantized``: weight keys already fake-quantized."""

    def is_quantized(self, module: nn.Module) -> bool:
        """Whether ``module`` is one of this backend's quantized layers."""

    def runtime(self) -> AbstractContextManager[None]:
        """The context every forward of the engine runs in (TE's FP4 autocast for ``te``)."""


REGISTRY: dict[str, QuantBackend] = {backend.name: backend for backend in (PROJECT, MODELOPT, TE)}


def get_backend(name: str) -> QuantBackend:
    """The concrete backend called ``name`` (``project``, ``modelopt`` or ``te``; not ``auto``)."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown concrete backend {name!r}; expected one of {list(REGISTRY)}") from None


def resolve_backend(backend: Backend, precision: Precision, device: torch.device) -> str:
    """The concrete backend for a model on ``device``; raises ``ValueError`` when unusable there."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {list(BACKENDS)}")
    on_cuda = device.type == "cuda" and torch.cuda.is_available()
    if backend == "auto":
        if not on_cuda:
            return "project"
        return "te" if precision == "nvfp4" and te_available() and is_blackwell() else "modelopt"
    if backend == "modelopt" and not on_cuda:
        raise ValueError(
            f"backend='modelopt' needs the model on a CUDA GPU (its NVFP4/FP8 kernels are CUDA-only), "
            f"but the model is on {device.type}"
            + ("" if torch.cuda.is_available() else " and this machine has no CUDA")
            + "; use backend='project', which runs on any device"
        )
    if backend == "te":
        if not te_available():
            raise ValueError(
                "backend='te' needs Transformer Engine, which is not importable here (install the "
                "'te' extra on a CUDA machine); use backend='project' or 'modelopt'"
            )
        if precision != "nvfp4" or not (on_cuda and is_blackwell()):
            raise ValueError(
                "backend='te' runs only precision='nvfp4' on a model placed on a Blackwell GPU "
                f"(got precision={precision!r} on {device.type}); use backend='modelopt' or 'project'"
            )
    return backend
