"""What a run leaves for diffusers users: the trained transformer, its LoRA, and a whole pipeline folder.

    final/transformer/   config.json + diffusion_pytorch_model.safetensors: the family's transformer class
                         loads it with `from_pretrained` (the merged weights of the exported policy)
    final/lora/          pytorch_lora_weights.safetensors in diffusers' key format for the family, with the
                         adapter's config (rank, alpha, targets) in the file's metadata as
                         `save_lora_weights(..., transformer_lora_adapter_metadata=...)` writes it, so
                         `pipe.load_lora_weights(final/lora)` applies the same scale α/r (without the
                         metadata diffusers assumes α = r)
    export_pipeline      the base folder's other components (only the files the pipeline loads) + a trained
                         transformer + a model card (README.md) and the run's sample grid: a folder
                         `DiffusionPipeline.from_pretrained` loads (the embedded model's, which no diffusers
                         pipeline class fits, carries its own: `from_pretrained(DIR, trust_remote_code=True)`,
                         `diffusion.embedded.model`), with `solrl_export.json` saying what it was exported
                         from. It is written into the sibling `<out>.tmp-<pid>` and renamed
                         into place at the end: a failed write (a full disk) removes that folder and leaves
                         `out` as it was. `out` must be new, empty, or a previous export (which it replaces).

Which policy: `theta` (the trained weights), `ema` (their EMA, what evaluation sees; θ when the run keeps
none) or `old` (the sampling policy θ_old).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import torch

from diffusion.loading import pipeline_files
from learner.evaluation import evaluated_weights, plain_transformer
from learner.lora_adapters import PEFT_INIT_LORA_WEIGHTS
from learner.training_state import TrainingState

ExportPolicy = Literal["theta", "ema", "old"]
TRANSFORMER_DIR, LORA_DIR = "transformer", "lora"
EXPORT_RECORD = "solrl_export.json"  # marks a folder as an export, which a later export may replace


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
                "init_lora_weights": PEFT_INIT_LORA_WEIGHTS[config.lora_init],
                "target_modules": sorted(state.lora_targets or ()), "lora_dropout": 0.0, "bias": "none"}
    layers = {k: v.contiguous() for k, v in adapter_parameters(state, policy).items()}
    pipeline_class(model_folder).save_lora_weights(folder, transformer_lora_layers=layers,
                                                   transformer_lora_adapter_metadata=metadata)
    return folder


def replaceable(out: Path) -> bool:
    """Whether an export may be written at `out`: nothing there, an empty folder, or a previous export
    (a folder holding EXPORT_RECORD). Anything else may be someone's model or data: never replaced."""
    if not out.exists():
        return True
    return out.is_dir() and (not any(out.iterdir()) or (out / EXPORT_RECORD).is_file())


def export_pipeline(model_folder: Path, out: Path, write_transformer: Callable[[Path], object],
                    record: Mapping[str, Any], documents: Mapping[str, str | Path] | None = None) -> Path:
    """A pipeline folder at `out`: the files of `model_folder` the pipeline loads (`pipeline_files`: nothing
    else of it) but the transformer's, copied, the transformer `write_transformer(folder)` writes, `record` as
    EXPORT_RECORD, and `documents` (name → text, or a file to copy: the model card, the sample grid). See the
    module docstring for the embedded model, the temporary sibling and what `out` may be."""
    # Imported here: diffusion.embedded.model imports diffusers' and transformers' model classes (seconds).
    from diffusion.embedded.model import has_embedded_layout, write_diffusers_pipeline

    out = Path(out).resolve()
    if not replaceable(out):
        raise ValueError(f"{out} holds files that are not an export ({EXPORT_RECORD} is missing); choose a new or "
                         "empty folder")
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)  # a killed export's leftover of the same pid
    created = next(p for p in (tmp, *tmp.parents) if p.parent.exists())  # tmp, or its first missing parent
    try:
        tmp.mkdir(parents=True)
        for name in pipeline_files(model_folder):
            if not name.startswith(f"{TRANSFORMER_DIR}/"):
                target = tmp / name
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    shutil.copyfile(Path(model_folder) / name, target)  # a hub snapshot's link: its content
                except OSError as exc:
                    raise OSError(exc.errno, f"copying {name}: {exc.strerror}") from exc
        write_transformer(tmp / TRANSFORMER_DIR)
        for name, document in (documents or {}).items():
            if isinstance(document, Path):
                shutil.copyfile(document, tmp / name)
            else:
                (tmp / name).write_text(document, encoding="utf-8")
        if has_embedded_layout(json.loads((tmp / "model_index.json").read_text())):
            write_diffusers_pipeline(tmp)
        (tmp / EXPORT_RECORD).write_text(json.dumps(dict(record), indent=2) + "\n")
        _move_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(created, ignore_errors=True)
        raise
    return out


def _move_into_place(tmp: Path, out: Path) -> None:
    """Rename `tmp` to `out`; an existing `out` (empty, or a previous export) is set aside first and
    restored if the rename fails, so `out` is always either the old folder or the whole new one."""
    if not out.exists():
        tmp.rename(out)
        return
    old = out.with_name(f"{out.name}.old-{os.getpid()}")
    shutil.rmtree(old, ignore_errors=True)
    out.rename(old)
    try:
        tmp.rename(out)
    except BaseException:
        old.rename(out)
        raise
    shutil.rmtree(old)
