"""Load a diffusers-format model folder into a `FlowPolicy`.

A folder is what `DiffusionPipeline.save_pretrained` writes: `model_index.json`, one sub-folder per
component (`transformer/`, `text_encoder*/`, `tokenizer*/`, optional `vae/`, `scheduler/`). Each
component is loaded with the class named in `model_index.json`, from local files only, weights
from safetensors only (no pickle). The family is read from the transformer's class. The embedded
tiny model and SD3.5-Large go through this same function.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

from diffusion.config import ModelConfig
from diffusion.families import family_for_transformer
from diffusion.policy import FlowPolicy

_LIBRARIES = ("diffusers", "transformers")


def _resolve_device(device: str | torch.device) -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _require(path: Path, what: str) -> None:
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is missing: {what}. A model folder is what diffusers' save_pretrained writes "
            "(model_index.json, transformer/, text_encoder/, tokenizer/, scheduler/, optional vae/)."
        )


def _component_class(library: str, class_name: str) -> type:
    if library not in _LIBRARIES:
        raise ValueError(f"component library {library!r} is not loadable here; expected one of {_LIBRARIES}")
    module = __import__(library)
    try:
        return getattr(module, class_name)
    except AttributeError as exc:
        raise ValueError(f"{library} has no class {class_name!r} (named in model_index.json)") from exc


def _load_component(folder: Path, name: str, library: str, class_name: str, dtype: torch.dtype):
    path = folder / name
    _require(path, f"component {name!r} is listed in model_index.json")
    cls = _component_class(library, class_name)
    if name.startswith("tokenizer"):
        tokenizer = cls.from_pretrained(str(path), local_files_only=True)
        # An offline hub lookup can silently yield a 2-token tokenizer; a real one is never that small.
        if len(tokenizer) <= 2:
            raise ValueError(f"tokenizer in {path} has only {len(tokenizer)} tokens: its files are incomplete")
        return tokenizer
    if name == "scheduler":
        return None  # the samplers build their σ grid from the config (see load_policy)
    weights = list(path.glob("*.safetensors"))
    if not weights:
        raise FileNotFoundError(
            f"{path} has no *.safetensors weights (only safetensors are loaded, never pickle files)"
        )
    model = cls.from_pretrained(str(path), torch_dtype=dtype, use_safetensors=True, local_files_only=True)
    return model.eval().requires_grad_(False)


def load_policy(
    path: str | os.PathLike,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    shift: float | None = None,
    resolution: int | None = None,
) -> FlowPolicy:
    """Load a model folder. `shift` overrides the scheduler's time shift; `resolution` (pixels) the
    transformer's default sample size."""
    folder = Path(path)
    _require(folder, "the model folder does not exist")
    _require(folder / "model_index.json", "model_index.json names the folder's components")
    index = json.loads((folder / "model_index.json").read_text())
    _require(folder / "transformer" / "config.json", "the transformer's config")
    transformer_class = json.loads((folder / "transformer" / "config.json").read_text())["_class_name"]
    family = family_for_transformer(transformer_class)
    if not family.supported:
        raise NotImplementedError(f"{folder}: model family {family.name!r} is not supported yet: {family.note}")

    target = _resolve_device(device)
    components: dict[str, nn.Module] = {}
    for name, spec in index.items():
        if name.startswith("_") or not isinstance(spec, list) or spec[0] is None:
            continue  # metadata, or a component saved as None
        component = _load_component(folder, name, spec[0], spec[1], dtype)
        if component is not None:
            components[name] = component.to(target) if isinstance(component, nn.Module) else component
    if "transformer" not in components:
        raise ValueError(f"{folder}/model_index.json lists no transformer")

    scheduler_config = folder / "scheduler" / "scheduler_config.json"
    _require(scheduler_config, "the scheduler config gives the time shift")
    scheduler = json.loads(scheduler_config.read_text())
    if scheduler.get("use_dynamic_shifting"):
        raise NotImplementedError("resolution-dependent (dynamic) time shift is not supported yet")

    config = components["transformer"].config
    vae = components.get("vae")
    scale = 2 ** (len(vae.config.block_out_channels) - 1) if vae is not None else 1
    size = config.sample_size if resolution is None else resolution // scale
    if resolution is not None and resolution % (scale * config.patch_size):
        raise ValueError(f"resolution {resolution} must be a multiple of {scale * config.patch_size}")
    return FlowPolicy(
        family,
        components,
        shift=float(scheduler.get("shift", 1.0) if shift is None else shift),
        latent_shape=(config.in_channels, size, size),
        device=target,
        dtype=dtype,
    )


def load_policy_from_config(config: ModelConfig) -> FlowPolicy:
    """load_policy with the config's folder, device and dtype (auto: bfloat16 on CUDA, else float32)."""
    device = _resolve_device(config.device)
    if config.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("model.device is 'cuda' but no CUDA device is visible: set model.device=auto or cpu")
    if config.dtype == "auto":
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    else:
        dtype = getattr(torch, config.dtype)
    return load_policy(config.folder(), device=device, dtype=dtype, shift=config.shift, resolution=config.resolution)
