"""Which layers the low-precision engine replaces: the one place that decides, for every backend.

The rule is the official Sol-RL one (NVlabs/Sana ``train_scripts/train_utils.py``,
``replace_linear_with_te`` and ``_is_replaceable_conv1x1``). A layer named ``name`` (its qualified
name in ``named_modules``) with ``d_in`` inputs and ``d_out`` outputs is replaced unless

    any(pattern in name for pattern in skip)             (substring, case-sensitive)
    or (min_dim > 0 and max(d_in, d_out) <= min_dim)

Candidates, in ``named_modules`` order:

* ``nn.Linear`` (``d_in, d_out = in_features, out_features``);
* with ``conv1x1=True`` (SANA), ``nn.Conv2d`` with kernel 1×1, stride 1×1 and ``groups == 1``
  (``d_in, d_out = in_channels, out_channels``), which runs as a Linear over channels.

Two deliberate sharpenings of the official ``isinstance`` checks: candidates are exactly of type
``nn.Linear`` / ``nn.Conv2d`` (a subclass may bypass ``forward``: ``nn.MultiheadAttention`` reads
its ``out_proj.weight`` directly), and a 1×1 conv must have zero padding (a padded one changes the
spatial size, which a Linear over channels cannot reproduce).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class EligibleLayers:
    """The layers the rule replaces, by qualified name, each tuple in ``named_modules`` order."""

    linears: tuple[str, ...]
    convs: tuple[str, ...]  # 1×1 convolutions (empty unless conv1x1)


def is_conv1x1(module: nn.Module) -> bool:
    """Whether ``module`` is a plain ``nn.Conv2d`` computing a Linear over channels at every pixel."""
    return (
        type(module) is nn.Conv2d
        and module.kernel_size == (1, 1)
        and module.stride == (1, 1)
        and module.groups == 1
        and module.padding in ((0, 0), "valid", "same")  # "same" pads nothing for a 1×1 kernel
    )


def _layer_dims(module: nn.Module, conv1x1: bool) -> tuple[int, int] | None:
    """``(d_in, d_out)`` of a candidate layer, ``None`` for any other module."""
    if type(module) is nn.Linear:
        return module.in_features, module.out_features
    if conv1x1 and is_conv1x1(module):
        return module.in_channels, module.out_channels
    return None


def is_replaced(name: str, d_in: int, d_out: int, *, skip: Sequence[str], min_dim: int) -> bool:
    """The official rule for one candidate layer (see the module docstring)."""
    if any(pattern in name for pattern in skip):
        return False
    return not (min_dim > 0 and max(d_in, d_out) <= min_dim)


def eligible_layers(
    model: nn.Module, *, skip: Sequence[str] = (), min_dim: int = 0, conv1x1: bool = False
) -> EligibleLayers:
    """The Linears (and, with ``conv1x1``, the 1×1 convolutions) of ``model`` that the engine replaces."""
    if isinstance(skip, str):
        raise TypeError(f"skip must be a sequence of patterns, not the string {skip!r}")
    linears: list[str] = []
    convs: list[str] = []
    for name, module in model.named_modules():
        dims = _layer_dims(module, conv1x1)
        if dims is not None and is_replaced(name, *dims, skip=skip, min_dim=min_dim):
            (linears if type(module) is nn.Linear else convs).append(name)
    return EligibleLayers(tuple(linears), tuple(convs))


def eligible_linear_names(model: nn.Module, *, skip: Sequence[str] = (), min_dim: int = 0) -> list[str]:
    """Qualified names of the ``nn.Linear`` layers the engine replaces (:func:`eligible_layers`)."""
    return list(eligible_layers(model, skip=skip, min_dim=min_dim).linears)


def eligible_conv1x1_names(model: nn.Module, *, skip: Sequence[str] = (), min_dim: int = 0) -> list[str]:
    """Qualified names of the 1×1 convolutions the engine replaces (:func:`eligible_layers`)."""
    return list(eligible_layers(model, skip=skip, min_dim=min_dim, conv1x1=True).convs)
