"""Low-precision rollout engines: a deep copy of a policy whose ``nn.Linear`` layers run quantized.

"FP4 explore, BF16 train": the learner keeps the high-precision policy; actors sample with an
engine built by :func:`quantize_model` and receive new weights through :func:`load_weights`.

Backends:

* ``project`` (any device, the CPU default): :class:`QuantLinear` fake-quantizes with this
  package's bit-exact NVFP4/FP8 functions. Weights are fake-quantized once per weight load and
  cached; activations are fake-quantized on every call with a *dynamic* per-tensor amax
  (``max|input|`` over the whole input, so every sample in a batch shares one activation scale).
  modelopt's usual PTQ flow instead calibrates a *static* activation amax on sample data.
* ``modelopt`` (CUDA only): ``mtq.quantize`` with the NVFP4 / W4A16-NVFP4 / FP8 preset. Weights
  are max-calibrated; no calibration data is run, so activation amax is dynamic there too.
* ``te`` (Blackwell + Transformer Engine): real NVFP4 GEMMs via ``te.pytorch.Linear``; call the
  engine inside :func:`diffusion.quant.te_backend.fp4_autocast`.

``auto`` picks ``te`` for ``nvfp4`` on a Blackwell GPU with TE, ``modelopt`` on other CUDA
devices and ``project`` elsewhere. The engine's ``skip``/``min_dim`` rules alone choose the layers
for every backend (modelopt's model-family exclusions such as ``*proj_out.*`` are not applied).
"""

from __future__ import annotations

import copy
import fnmatch
import warnings
from collections.abc import Collection, Mapping, Sequence
from typing import Literal, get_args

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from diffusion.quant.fp8 import fp8_fake_quant
from diffusion.quant.nvfp4 import nvfp4_fake_quant
from diffusion.quant.te_backend import (
    TE_DIM_MULTIPLE,
    is_blackwell,
    is_te_linear,
    swap_to_te_linear,
    te_available,
)

Precision = Literal["nvfp4", "nvfp4_w4a16", "fp8", "none"]
Backend = Literal["auto", "project", "modelopt", "te"]
PRECISIONS: tuple[str, ...] = get_args(Precision)
BACKENDS: tuple[str, ...] = get_args(Backend)
QUANTIZED_PRECISIONS: tuple[str, ...] = tuple(p for p in PRECISIONS if p != "none")

_MODELOPT_PRESETS = {
    "nvfp4": "NVFP4_DEFAULT_CFG",
    "nvfp4_w4a16": "W4A16_NVFP4_CFG",
    "fp8": "FP8_DEFAULT_CFG",
}


class QuantLinear(nn.Linear):
    """``nn.Linear`` whose forward uses fake-quantized weights (and, for W4A4/FP8, activations).

    Keeps the original ``weight``/``bias`` Parameters under their names, so ``state_dict()`` keys
    match the unquantized model; its caches are non-persistent buffers: ``weight_fq`` (the
    fake-quantized weight) and ``weight_amax`` (the FP32 ``max|W|`` it was computed with). Both go
    stale when the weight changes: call :meth:`refresh` (``load_weights`` does).
    """

    weight_fq: torch.Tensor
    weight_amax: torch.Tensor

    def __init__(self, linear: nn.Linear, precision: Precision, block_size: int = 16) -> None:
        if precision not in QUANTIZED_PRECISIONS:
            raise ValueError(
                f"QuantLinear precision must be one of {list(QUANTIZED_PRECISIONS)}, got {precision!r}"
            )
        # Built on the meta device, then handed the existing Parameters: nothing is reallocated.
        super().__init__(
            linear.in_features,
            linear.out_features,
            bias=linear.bias is not None,
            device="meta",
            dtype=linear.weight.dtype,
        )
        self.weight = linear.weight
        self.bias = linear.bias
        self.precision = precision
        self.block_size = block_size
        self.register_buffer("weight_fq", torch.empty(0), persistent=False)
        self.register_buffer("weight_amax", torch.empty(0), persistent=False)
        self.refresh()

    @torch.no_grad()
    def refresh(self) -> None:
        """Recompute ``weight_amax`` and ``weight_fq`` from the current weight."""
        weight = self.weight.detach()
        self.weight_amax = weight.abs().amax().float()
        if self.precision == "fp8":
            self.weight_fq = fp8_fake_quant(weight, self.weight_amax)
        else:
            self.weight_fq = nvfp4_fake_quant(weight, self.block_size)

    @torch.no_grad()
    def adopt_quantized(self) -> None:
        """Take the current weight as already fake-quantized (an NVFP4 snapshot decoded by the explorer).

        Re-quantizing decoded NVFP4 values is not always the identity in FP32 (the tensor scale can move
        by one ulp), so values that arrive quantized are used as they are, bit for bit.
        """
        if self.precision == "fp8":
            raise ValueError("adopt_quantized is for NVFP4 layers; FP8 engines take dense weights")
        weight = self.weight.detach()
        self.weight_amax = weight.abs().amax().float()
        self.weight_fq = weight.clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.precision == "nvfp4":
            x = nvfp4_fake_quant(x, self.block_size)
        elif self.precision == "fp8":
            x = fp8_fake_quant(x)
        return F.linear(x, self.weight_fq, self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, precision={self.precision}"


def name_matches(name: str, pattern: str) -> bool:
    """Whether the dotted module ``name`` contains ``pattern`` as a run of whole components.

    ``pattern`` is an fnmatch glob (case-sensitive) matched against the dotted name with an implicit
    ``*`` on either side at component boundaries: ``"norm1"`` matches ``"blocks.0.norm1.linear"``
    and ``"attn.qkv"`` matches ``"blocks.3.attn.qkv"``, but ``"norm1"`` does not match
    ``"blocks.0.norm10"`` and ``"qkv"`` does not match ``"to_qkv"``; ``"proj*"`` matches
    ``"attn.proj_out"``.
    """
    globs = (pattern, f"*.{pattern}", f"{pattern}.*", f"*.{pattern}.*")
    return any(fnmatch.fnmatchcase(name, glob) for glob in globs)


def eligible_linear_names(model: nn.Module, *, skip: Sequence[str] = (), min_dim: int = 0) -> list[str]:
    """Qualified names of the ``nn.Linear`` modules to quantize, in ``named_modules`` order.

    Eligible: exactly of type ``nn.Linear`` (subclasses may not route through ``forward``; e.g.
    ``nn.MultiheadAttention`` reads ``out_proj.weight`` directly), no ``skip`` pattern matches the
    name (see :func:`name_matches`), and ``min(in_features, out_features) >= min_dim``.
    """
    return [
        name
        for name, module in model.named_modules()
        if type(module) is nn.Linear
        and not any(name_matches(name, pattern) for pattern in skip)
        and min(module.in_features, module.out_features) >= min_dim
    ]


def _model_device(model: nn.Module) -> torch.device:
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")


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


def quantize_model(
    model: nn.Module,
    precision: Precision,
    *,
    skip: Sequence[str] = (),
    min_dim: int = 0,
    backend: Backend = "auto",
    block_size: int = 16,
) -> nn.Module:
    """A deep copy of ``model`` with every eligible ``nn.Linear`` quantized; ``model`` is untouched.

    ``precision``: ``"nvfp4"`` (W4A4), ``"nvfp4_w4a16"`` (weights only), ``"fp8"`` (per-tensor E4M3
    weights and activations) or ``"none"`` (a plain deep copy). Layer selection: see
    :func:`eligible_linear_names`. ``block_size`` other than 16 is supported by the project backend
    only.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; expected one of {list(PRECISIONS)}")
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {list(BACKENDS)}")
    if precision == "none":
        return copy.deepcopy(model)
    resolved = resolve_backend(backend, precision, _model_device(model))
    if resolved != "project" and block_size != 16:
        raise ValueError(f"backend {resolved!r} supports block_size=16 only, got {block_size}")
    engine = copy.deepcopy(model)
    names = eligible_linear_names(engine, skip=skip, min_dim=min_dim)
    if resolved == "te":
        names = [
            name
            for name in names
            if not (
                engine.get_submodule(name).in_features % TE_DIM_MULTIPLE
                or engine.get_submodule(name).out_features % TE_DIM_MULTIPLE
            )
        ]
        return swap_to_te_linear(engine, names)
    if resolved == "modelopt":
        return _modelopt_quantize(engine, names, precision)
    for name in names:
        quantized = QuantLinear(engine.get_submodule(name), precision, block_size)
        if not name:
            return quantized
        engine.set_submodule(name, quantized)
    return engine


def _modelopt_quantize(engine: nn.Module, names: Sequence[str], precision: Precision) -> nn.Module:
    if not names:
        return engine
    import modelopt.torch.quantization as mtq

    config = copy.deepcopy(getattr(mtq, _MODELOPT_PRESETS[precision]))
    # Keep only the format entries (what to quantize and how); the engine's own selection decides
    # which layers, so modelopt's model-family exclusions would only make backends disagree.
    config["quant_cfg"] = [{"quantizer_name": "*", "enable": False}] + [
        entry for entry in config["quant_cfg"] if entry.get("enable", True) and "parent_class" not in entry
    ]
    # Calibrate only once the quantizers of non-eligible modules are off.
    config["algorithm"] = None
    mtq.quantize(engine, config, forward_loop=None)
    eligible = set(names)
    mtq.disable_quantizer(engine, lambda quantizer_name: quantizer_name.rpartition(".")[0] not in eligible)
    _modelopt_calibrate(engine)
    return engine


def _modelopt_calibrate(engine: nn.Module) -> None:
    import modelopt.torch.quantization as mtq

    # The max calibrator keeps a running max across calibrations: without the reset a refreshed
    # amax would be max(old, new), i.e. stale whenever the weights shrink.
    for name, module in engine.named_modules():
        if name.endswith("weight_quantizer") and module.is_enabled:
            module.reset_amax()
    mtq.calibrate(engine, algorithm="max", forward_loop=None)


def refresh_quantizers(engine: nn.Module, *, prequantized: Collection[str] = ()) -> None:
    """Recompute every quantizer's amax/scales and cached weights from the current weights.

    Project backend: :meth:`QuantLinear.refresh` on each layer. modelopt backend: weight amax reset
    then max calibration without data. TE backend: nothing to do (TE quantizes every forward).
    """
    uses_modelopt = False
    for name, module in engine.named_modules():
        if isinstance(module, QuantLinear):
            if f"{name}.weight" in prequantized:
                module.adopt_quantized()
            else:
                module.refresh()
        elif hasattr(module, "weight_quantizer"):
            uses_modelopt = True
    if uses_modelopt:
        _modelopt_calibrate(engine)


def quantized_layer_names(engine: nn.Module) -> list[str]:
    """Qualified names of the layers of ``engine`` that run quantized, whatever the backend."""
    names = []
    for name, module in engine.named_modules():
        weight_quantizer = getattr(module, "weight_quantizer", None)
        if (
            isinstance(module, QuantLinear)
            or is_te_linear(module)
            or (weight_quantizer is not None and weight_quantizer.is_enabled)
        ):
            names.append(name)
    return names


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
