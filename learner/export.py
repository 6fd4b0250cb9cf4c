"""What a run leaves for diffusers users: the trained transformer, its LoRA, and a whole pipeline folder.

    final/transformer/   config.json + diffusion_pytorch_model.safetensors: the family's transformer class
                         loads it with `from_pretrained` (the merged weights of the exported policy)
    final/lora/          pytorch_lora_weights.safetensors in diffusers' key format for the family, with the
                         adapter's config (rank, alpha, targets) in the file's metadata as
                         `save_lora_weights(..., transformer_lora_adapter_metadata=...)` writes it, so
                         `pipe.load_lora_weights(final/lora)` applies the same scale α/r (without the
                         metadata diffusers assumes α = r)
    export_pipeline      the base folder's other components + a trained transformer: a folder
                         `DiffusionPipeline.from_pretrained` loads

Which policy: `theta` (the trained weights), `ema` (their EMA, what evaluation sees; θ when the run keeps
none) or `old` (the sampling policy θ_old).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Literal

import torch

from learner.evaluation import evaluated_weights, plain_transformer
from learner.training_state import TrainingState

ExportPolicy = Literal["theta", "ema", "old"]
TRANSFORMER_DIR, LORA_DIR = "transformer", "lora"


def adapter_parameters(state: TrainingState, policy: ExportPolicy) -> dict[str, torch.Tensor]:
    """The policy's LoRA parameters by peft's key (`<module>.lora_A.weight`, `<module>.lora_B.weight`)."""
    if state.mode != "lora":
        raise ValueError("only a LoRA run has adapters to export (training.mode=lora)")
    if policy == "old":
        return {k: v.detach() for k, v in state.old_parameters().items()}
    if policy == "ema" and state.ema is not None:
        return {k: v.detach() for k, v in state.ema.average.items()}
    return {k: v.detach() for k, v in state.theta_parameters().items()}


def merged_weights(state: TrainingState, policy: ExportPolicy) -> dict[str, torch.Tensor]:
    """The policy merged into the plain transformer's keys (fresh tensors where θ's own would alias)."""
    if policy == "old":
        return state.merged_weights("old")
    return evaluated_weights(state) if policy == "ema" else state.merged_weights("theta")


def pipeline_class(model_folder: Path):
    """The diffusers pipeline class a model folder names (`model_index.json`'s `_class_name`)."""
    import diffusers

    name = json.loads((Path(model_folder) / "model_index.json").read_text())["_class_name"]
    return getattr(diffusers, name)


def save_transformer(state: TrainingState, weights: dict[str, torch.Tensor], folder: Path) -> Path:
    """`weights` as a diffusers transformer folder of the policy's class and config."""
    plain_transformer(state.transformer, weights).save_pretrained(folder, safe_serialization=True)
    return folder


def save_lora(state: TrainingState, policy: ExportPolicy, model_folder: Path, folder: Path) -> Path:
    """The policy's adapter as diffusers' `pytorch_lora_weights.safetensors`, with its config as metadata."""
    config = state.config
    metadata = {"r": config.lora_rank, "lora_alpha": config.lora_alpha,
                "target_modules": sorted(state.lora_targets or ()), "lora_dropout": 0.0, "bias": "none"}
    layers = {k: v.contiguous() for k, v in adapter_parameters(state, policy).items()}
    pipeline_class(model_folder).save_lora_weights(folder, transformer_lora_layers=layers,
                                                   transformer_lora_adapter_metadata=metadata)
    return folder


def export_pipeline(model_folder: Path, transformer_folder: Path, out: Path) -> Path:
    """A pipeline folder: every component of `model_folder` but the transformer, copied, and the
    transformer of `transformer_folder`."""
    out.mkdir(parents=True, exist_ok=True)
    for item in Path(model_folder).iterdir():
        if item.name == TRANSFORMER_DIR:
            continue
        target = out / item.name
        (shutil.copytree(item, target, dirs_exist_ok=True) if item.is_dir() else shutil.copy2(item, target))
    shutil.copytree(transformer_folder, out / TRANSFORMER_DIR, dirs_exist_ok=True)
    return out
