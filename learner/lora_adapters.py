"""θ and θ_old as two peft LoRA adapters on one transformer, and their merge into plain weights.

"default" (θ, trained) and "old" (θ_old, frozen) are initialised identical with B = 0, so θ = θ_old =
base at the start; the reference is the transformer with its adapters disabled. `TrainingState` switches
between them by flipping two attributes on each LoRA layer (no copies).

A's initial draw is `training.lora_init` (`LORA_INITS`): "gaussian", A ~ N(0, (1/r)²), is what every official
config creates its adapters with (peft `init_lora_weights="gaussian"`: NVlabs/Sana `configs/sol_rl/*.py`
`train.lora_init_mode`, NVlabs/DiffusionNFT and yifan123/flow_grpo `scripts/train_sd3.py`'s `LoraConfig`);
"kaiming" is peft's and nn.Linear's default, kaiming-uniform(a=√5), std 1/√(3·fan_in). The two differ by
(1/r)·√(3·fan_in): 2.7× larger A for the gaussian on SD3.5-L (fan_in 2432, r 32), 2.3× smaller on the
embedded world (fan_in 64, r 32). Since B = 0, the first steps' change of W = B·A scales with A.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable, Sequence

import torch
from torch import nn

from diffusion.lora import add_delta
from learner.config import TrainingConfig

ADAPTERS = {"theta": "default", "old": "old"}  # peft adapter name of each LoRA view
LoraLayers = list[tuple[str, nn.Module]]


def _gaussian(a: torch.Tensor, rank: int, generator: torch.Generator) -> None:
    """peft's `init_lora_weights="gaussian"`: A ~ N(0, std = 1/r)."""
    nn.init.normal_(a, std=1.0 / rank, generator=generator)


def _kaiming(a: torch.Tensor, rank: int, generator: torch.Generator) -> None:
    """peft's default (`init_lora_weights=True`) and nn.Linear's: kaiming-uniform(a=√5), bound 1/√fan_in."""
    nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=generator)


# How A is drawn, by `training.lora_init` (B is always 0).
LORA_INITS: dict[str, Callable[[torch.Tensor, int, torch.Generator], None]] = {"gaussian": _gaussian,
                                                                               "kaiming": _kaiming}
# The same choice as peft's `LoraConfig.init_lora_weights` names it (an export's adapter metadata records it).
PEFT_INIT_LORA_WEIGHTS: dict[str, str | bool] = {"gaussian": "gaussian", "kaiming": True}


def inject_adapters(transformer: nn.Module, config: TrainingConfig, targets: Sequence[str], device: torch.device,
                    seed: int) -> tuple[LoraLayers, dict[str, nn.Parameter], dict[str, nn.Parameter]]:
    """Add the two adapters to `transformer` (in place): its LoRA layers, θ's and θ_old's parameters by
    canonical name. A drawn by `config.lora_init` (`LORA_INITS`) from its own generator seeded with `seed`,
    B = 0; only θ requires grad. The global torch RNG is left as it was."""
    from peft import LoraConfig
    from peft.tuners.tuners_utils import BaseTunerLayer

    if not hasattr(transformer, "add_adapter"):
        raise TypeError(f"{type(transformer).__name__} has no add_adapter (a diffusers PeftAdapterMixin model)")
    devices = [device.index or 0] if device.type == "cuda" else []
    # peft's own init draws from the global RNG; a second adapter makes peft warn (it is on purpose).
    with torch.random.fork_rng(devices=devices), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Already found a `peft_config`")
        for adapter in ("default", "old"):
            lora = LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, target_modules=list(targets),
                              init_lora_weights=True, lora_dropout=0.0)
            transformer.add_adapter(lora, adapter_name=adapter)
    layers = [(name, module) for name, module in transformer.named_modules() if isinstance(module, BaseTunerLayer)]
    for name, layer in layers:
        for attribute in ("_active_adapter", "_disable_adapters", "get_delta_weight", "get_base_layer"):
            if not hasattr(layer, attribute):
                raise RuntimeError(f"peft layer {name} has no {attribute!r}: unsupported peft version")
    theta, old = adapter_parameters(transformer, "default"), adapter_parameters(transformer, "old")
    if theta.keys() != old.keys():
        raise RuntimeError("the 'default' and 'old' adapters have different parameters")
    generator, draw_a = torch.Generator().manual_seed(seed), LORA_INITS[config.lora_init]
    with torch.no_grad():
        for name, param in theta.items():
            if ".lora_A." in name:
                fresh = torch.empty(param.shape, dtype=torch.float32)
                draw_a(fresh, config.lora_rank, generator)
                param.copy_(fresh)
            elif ".lora_B." in name:
                param.zero_()
            else:
                raise RuntimeError(f"unexpected LoRA parameter {name}: only plain LoRA (A, B) is supported")
        for name, param in old.items():
            param.copy_(theta[name])
    for param in transformer.parameters():
        param.requires_grad_(False)
    for param in theta.values():
        param.requires_grad_(True)
    return layers, theta, old


def adapter_parameters(transformer: nn.Module, adapter: str) -> dict[str, nn.Parameter]:
    """Parameters of one adapter, named without the adapter segment (…lora_A.weight)."""
    pattern = re.compile(rf"(\.lora_\w+)\.{re.escape(adapter)}(?=\.|$)")
    out: dict[str, nn.Parameter] = {}
    for name, param in transformer.named_parameters():
        canonical, found = pattern.subn(r"\1", name)
        if found:
            out[canonical] = param
    return out


def merged_lora(transformer: nn.Module, layers: LoraLayers, adapter: str | None,
                base_keys: list[str]) -> dict[str, torch.Tensor]:
    """The transformer with `adapter` merged into each LoRA layer's weight, under the base model's keys
    (None: no adapter, the base model itself)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in transformer.state_dict().items():
        if ".lora_" in key:
            continue
        out[key.replace(".base_layer.", ".")] = value
    for name, layer in layers if adapter is not None else ():
        out[f"{name}.weight"] = add_delta(layer.get_base_layer().weight, layer.get_delta_weight(adapter))
    return {key: out[key] for key in base_keys if key in out}


def enable_gradient_checkpointing(transformer: nn.Module) -> None:
    """diffusers' `ModelMixin.enable_gradient_checkpointing` on the trained transformer only (θ_old and the
    reference run under no_grad, where diffusers skips checkpointing anyway). Its default checkpoint
    function is non-reentrant, which gives the LoRA parameters gradients although the blocks' inputs do
    not require grad."""
    if not getattr(transformer, "_supports_gradient_checkpointing", False) or not hasattr(
        transformer, "enable_gradient_checkpointing"
    ):
        raise TypeError(f"{type(transformer).__name__} does not support gradient checkpointing (a diffusers "
                        "model with _supports_gradient_checkpointing); set training.gradient_checkpointing=false")
    transformer.enable_gradient_checkpointing()
