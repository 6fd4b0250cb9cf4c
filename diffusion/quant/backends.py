"""The quantization backends, by name, and the one choice of precision and backend for a device.

============  ==========================================================  =========================
backend       layers                                                      runs
============  ==========================================================  =========================
``project``   :class:`QuantLinear` / :class:`QuantConv1x1` (any device)  fake quantization
``modelopt``  modelopt quantizers on Linears (CUDA), project 1×1 convs    fake quantization
``torchao``   :class:`Float8Linear` / :class:`Float8Conv1x1`              real FP8 GEMMs (sm_89+)
``te``        ``te.pytorch.Linear`` (Blackwell GPU, ``nvfp4`` only)       real NVFP4 GEMMs
============  ==========================================================  =========================

Fake quantization computes the low-precision values and then multiplies in high precision: the
ranking sees the format's errors (fidelity) but exploration is *slower* than BF16. :func:`choose_engine`
decides, from the request and the device's facts (:class:`DeviceFacts`, an input, so the rule is tested
for every GPU generation on a CPU machine):

============================  ==================================================================
device                        ``precision: auto``
============================  ==================================================================
Blackwell (sm_100, sm_120)    ``nvfp4`` on ``te`` (real NVFP4), else ``fp8`` on ``torchao``
Hopper, Ada (sm_90, sm_89)    ``fp8`` on ``torchao`` (real FP8)
older GPUs (sm_80)            ``none``: BF16 exploration (no FP8/FP4 tensor cores to gain from)
CPU                           ``nvfp4`` on ``project``: the paper's format emulated, for fidelity
============================  ==================================================================

An explicit precision (or backend) that the device can only emulate (NVFP4 on Hopper, anything on a
CPU) is refused unless ``allow_emulation`` is set, with the words of :attr:`EngineChoice.summary`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Literal, Protocol, get_args

import torch
from torch import nn

from diffusion.quant.modelopt_backend import MODELOPT
from diffusion.quant.precision import FP8_PRECISIONS, PRECISIONS, Precision
from diffusion.quant.project_backend import PROJECT
from diffusion.quant.te_backend import TE, te_available
from diffusion.quant.torchao_backend import TORCHAO, torchao_available

Backend = Literal["auto", "project", "modelopt", "torchao", "te"]
BACKENDS: tuple[str, ...] = get_args(Backend)
# What a config asks for: a precision, or "auto" (the fastest one this device runs for real).
PrecisionRequest = Literal["auto", "nvfp4", "nvfp4_w4a16", "fp8", "fp8_tensor", "none"]
PRECISION_REQUESTS: tuple[str, ...] = get_args(PrecisionRequest)
assert PRECISION_REQUESTS[1:] == PRECISIONS, "a precision request is 'auto' or a precision"


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


REGISTRY: dict[str, QuantBackend] = {backend.name: backend for backend in (PROJECT, MODELOPT, TORCHAO, TE)}

# The (precision, backend) pairs that run real low-precision GEMMs, and the GPUs that have them.
REAL_KERNELS: dict[tuple[str, str], str] = {("nvfp4", "te"): "NVFP4", ("fp8", "torchao"): "FP8",
                                             ("fp8_tensor", "torchao"): "FP8"}


def get_backend(name: str) -> QuantBackend:
    """The concrete backend called ``name`` (``project``, ``modelopt``, ``torchao`` or ``te``; not ``auto``)."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown concrete backend {name!r}; expected one of {list(REGISTRY)}") from None


@dataclass(frozen=True)
class DeviceFacts:
    """What the choice reads of the device the engine runs on."""

    capability: tuple[int, int] | None  # CUDA compute capability; None: no CUDA GPU (the CPU)
    te: bool = False  # Transformer Engine imports there
    torchao: bool = False  # torchao imports there

    @property
    def name(self) -> str:
        return "CPU" if self.capability is None else f"sm_{self.capability[0]}{self.capability[1]}"

    @property
    def fp4_gemms(self) -> bool:
        return self.capability is not None and self.capability[0] in (10, 12)

    @property
    def fp8_gemms(self) -> bool:
        return self.capability is not None and self.capability >= (8, 9)

    def runs_real(self, precision: str, backend: str) -> bool:
        """Whether ``precision`` on ``backend`` runs real low-precision GEMMs here."""
        kind = REAL_KERNELS.get((precision, backend))
        if kind == "NVFP4":
            return self.fp4_gemms and self.te
        return kind == "FP8" and self.fp8_gemms and self.torchao


def device_facts(device: torch.device) -> DeviceFacts:
    """The facts of ``device`` on this machine (a CPU device, or a CUDA one that is not there, is the CPU)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return DeviceFacts(None, te_available(), torchao_available())
    return DeviceFacts(torch.cuda.get_device_capability(device), te_available(), torchao_available())


@dataclass(frozen=True)
class EngineChoice:
    """The precision and concrete backend an engine runs with, and whether that is only an emulation."""

    precision: Precision
    backend: str  # "none" for precision "none"
    emulated: bool  # fake quantization: fidelity without the speed
    summary: str  # what will run, in words (the preflight's backend row, the explorer's log)


def _auto_precision(device: DeviceFacts) -> tuple[Precision, str, str]:
    """``(precision, backend, why)`` of ``precision: auto`` on ``device`` (the module docstring's table);
    ``why`` is empty where the summary says it all."""
    if device.capability is None:
        return "nvfp4", "project", ""
    if device.fp4_gemms and device.te:
        return "nvfp4", "te", ""
    if device.fp8_gemms and device.torchao:
        return "fp8", "torchao", ""
    if device.fp8_gemms:
        return "none", "none", "this GPU has FP8 tensor cores but torchao is missing: pip install torchao"
    return "none", "none", f"no FP8/FP4 tensor cores on {device.name}"


def _check_backend(backend: str, precision: str, device: DeviceFacts) -> None:
    """Raise ``ValueError`` when the explicitly named ``backend`` cannot run ``precision`` on ``device``."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {list(BACKENDS)}")
    if backend == "modelopt" and device.capability is None:
        raise ValueError(
            "backend='modelopt' needs the model on a CUDA GPU (its NVFP4/FP8 kernels are CUDA-only), but it is "
            "on the CPU; use backend='project', which runs on any device"
        )
    if backend == "te":
        if not device.te:
            raise ValueError(
                "backend='te' needs Transformer Engine, which is not importable here (install the 'te' extra on a "
                "CUDA machine); use backend='project' or 'modelopt'"
            )
        if precision != "nvfp4" or not device.fp4_gemms:
            raise ValueError(
                f"backend='te' runs only precision='nvfp4' on a Blackwell GPU (got precision={precision!r} on "
                f"{device.name}); use backend='auto'"
            )
    if backend == "torchao":
        if not device.torchao:
            raise ValueError("backend='torchao' needs torchao (pip install torchao); use backend='project'")
        if precision not in FP8_PRECISIONS:
            raise ValueError(f"backend='torchao' runs only precision='fp8' or 'fp8_tensor' (got {precision!r}); "
                             "use backend='auto'")
        if device.capability is not None and not device.fp8_gemms:
            raise ValueError(
                f"backend='torchao' needs FP8 tensor cores (sm_89 or newer), got {device.name}; use backend='auto'"
            )


def _words(precision: str, backend: str, device: DeviceFacts) -> str:
    if precision == "none":
        return f"BF16 exploration (a full-precision copy) on {device.name}"
    if device.runs_real(precision, backend):
        return f"{precision} on {backend}: real {REAL_KERNELS[(precision, backend)]} GEMMs on {device.name}"
    if (precision, backend) in REAL_KERNELS:  # the library's reference kernels, without the GPU's
        return (f"{precision} on {backend} without its GPU kernels on {device.name}: exploration will be slower "
                "than BF16 (fidelity, not speed)")
    return (f"{precision} emulated by the {backend} backend's fake quantization on {device.name}: exploration "
            "will be slower than BF16 (fidelity, not speed)")


def choose_engine(
    precision: PrecisionRequest, backend: Backend, device: DeviceFacts, *, allow_emulation: bool = False
) -> EngineChoice:
    """The engine for the request on ``device``; raises ``ValueError`` (one line, naming the fix) when it
    cannot run there, or when it would only be emulated and ``allow_emulation`` is off.

    ``precision='auto'`` (with ``backend='auto'``) is the module docstring's table and never refused.
    """
    if precision not in PRECISION_REQUESTS:
        raise ValueError(f"unknown precision {precision!r}; expected one of {list(PRECISION_REQUESTS)}")
    if precision == "auto":
        if backend != "auto":
            raise ValueError(f"explore.precision=auto chooses the backend too; set explore.backend=auto "
                             f"(got {backend!r}) or name the precision")
        chosen, concrete, why = _auto_precision(device)
        emulated = chosen != "none" and not device.runs_real(chosen, concrete)
        summary = f"auto → {_words(chosen, concrete, device)}" + (f"; {why}" if why else "")
        return EngineChoice(chosen, concrete, emulated, summary)
    if precision == "none":
        return EngineChoice("none", "none", False, _words("none", "none", device))
    if backend == "auto":
        real = [name for (p, name) in REAL_KERNELS if p == precision and device.runs_real(p, name)]
        concrete = real[0] if real else ("project" if device.capability is None else "modelopt")
    else:
        _check_backend(backend, precision, device)
        concrete = backend
    emulated = not device.runs_real(precision, concrete)
    summary = _words(precision, concrete, device)
    if emulated:
        auto, auto_backend, _ = _auto_precision(device)
        if auto != "none" and device.runs_real(auto, auto_backend):
            summary += f"; {auto} runs real {REAL_KERNELS[(auto, auto_backend)]} GEMMs here (explore.precision=auto)"
        if not allow_emulation:
            raise ValueError(f"explore.precision={precision}: {summary}; set explore.allow_emulation=true to run it "
                             "anyway, or explore.precision=auto")
    return EngineChoice(precision, concrete, emulated, summary)


def resolve_backend(
    backend: Backend, precision: Precision, device: torch.device, *, allow_emulation: bool = True
) -> str:
    """The concrete backend for ``precision`` on ``device`` (:func:`choose_engine` with this machine's facts)."""
    return choose_engine(precision, backend, device_facts(device), allow_emulation=allow_emulation).backend
