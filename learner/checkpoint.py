"""Checkpoints of a `TrainingState`: safetensors and JSON only (never pickle).

A checkpoint is a folder:

* ``theta.safetensors`` / ``old.safetensors``: θ's trainable parameters and θ_old's (LoRA: the
  adapter parameters, named without the adapter segment; full mode: all parameters);
* ``optimizer.safetensors``: AdamW's per-parameter tensors, keyed ``<state>/<param name>``
  (``exp_avg/…``, ``exp_avg_sq/…``);
* ``rng.safetensors``: the torch CPU RNG state (uint8) and, on CUDA, each device's;
* ``meta.json`` (written last): format, mode and LoRA settings, parameter shapes, AdamW step counts
  and hyper-parameters, ``skipped_steps``, the iteration and the caller's ``extra`` dict.

Saving writes ``<dir>.tmp`` (``meta.json`` last) and renames it to ``<dir>`` only when complete, so
a crash never leaves a half-written ``<dir>``. Replacing an existing ``<dir>`` moves it to
``<dir>.old`` first; if a crash falls between the two renames, loading ``<dir>`` takes the complete
``<dir>.tmp`` (or ``<dir>.old``). Loading checks every name and shape before changing anything.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from learner.training_state import TrainingState

FORMAT = "sol-rl-training-state"
VERSION = 1
HYPER_PARAMS = ("lr", "betas", "weight_decay", "eps")


def _cpu(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu").contiguous()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    save_file({k: _cpu(v) for k, v in tensors.items()}, str(path), metadata={"format": FORMAT})
    _fsync(path)


def _json_value(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, torch.Tensor):
        return value.item()
    return value


def save_checkpoint(dir: str | os.PathLike, state: TrainingState, *, iteration: int, extra: dict | None = None) -> Path:
    """Write `state` (+ iteration, extra) to folder `dir` atomically; returns the folder."""
    final = Path(dir)
    tmp = final.with_name(final.name + ".tmp")
    previous = final.with_name(final.name + ".old")
    extra = dict(extra or {})
    try:
        json.dumps(extra)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"save_checkpoint: extra must be JSON-serialisable: {exc}") from exc

    theta = state.theta_parameters()
    old = state.old_parameters()
    index = {id(p): name for name, p in theta.items()}
    optimizer_tensors: dict[str, torch.Tensor] = {}
    optimizer_steps: dict[str, float] = {}
    for param, param_state in state.optimizer.state.items():
        name = index[id(param)]
        for key, value in param_state.items():
            if key == "step":
                optimizer_steps[name] = float(value)
            elif isinstance(value, torch.Tensor):
                optimizer_tensors[f"{key}/{name}"] = value
            else:
                raise TypeError(f"save_checkpoint: optimizer state {key!r} of {name} is not a tensor")
    groups = [
        {k: _json_value(v) for k, v in group.items() if k != "params"} for group in state.optimizer.param_groups
    ]
    rng = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # untouched CUDA: no CUDA RNG was used
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            rng[f"cuda:{i}"] = s
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "mode": state.mode,
        "lora_rank": state.config.lora_rank if state.mode == "lora" else None,
        "lora_alpha": state.config.lora_alpha if state.mode == "lora" else None,
        "lora_targets": state.lora_targets,
        "params": {name: list(p.shape) for name, p in theta.items()},
        "dtypes": {name: str(p.dtype).removeprefix("torch.") for name, p in theta.items()},
        "optimizer": {"param_groups": groups, "step": optimizer_steps},
        "skipped_steps": state.skipped_steps,
        "iteration": int(iteration),
        "extra": extra,
    }

    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    _write_tensors(tmp / "theta.safetensors", theta)
    _write_tensors(tmp / "old.safetensors", old)
    _write_tensors(tmp / "optimizer.safetensors", optimizer_tensors)
    _write_tensors(tmp / "rng.safetensors", rng)
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    _fsync(tmp / "meta.json")
    _fsync(tmp)
    if final.exists():
        if previous.exists():
            shutil.rmtree(previous)
        final.rename(previous)
    tmp.rename(final)
    _fsync(final.parent)
    if previous.exists():
        shutil.rmtree(previous)
    return final


def _check(what: str, expected: dict[str, torch.Tensor], found: dict[str, torch.Tensor], where: Path) -> None:
    missing = sorted(expected.keys() - found.keys())
    if missing:
        raise ValueError(f"{where}: {what} lacks {missing[0]!r} ({len(missing)} missing): the model differs")
    unexpected = sorted(found.keys() - expected.keys())
    if unexpected:
        raise ValueError(f"{where}: {what} has unexpected {unexpected[0]!r} ({len(unexpected)}): the model differs")
    for key, target in expected.items():
        source = found[key]
        if source.shape != target.shape:
            raise ValueError(
                f"{where}: {what} {key!r} has shape {tuple(source.shape)}, the state has {tuple(target.shape)}"
            )
        if source.dtype != target.dtype:
            raise ValueError(f"{where}: {what} {key!r} has dtype {source.dtype}, the state has {target.dtype}")


def _complete_folder(folder: Path) -> Path:
    """`folder`, or — when a save died between its two renames — its complete `.tmp` or `.old`."""
    if (folder / "meta.json").exists():
        return folder
    if not folder.exists():
        for suffix in (".tmp", ".old"):  # .tmp has meta.json only once complete; it is the newer one
            candidate = folder.with_name(folder.name + suffix)
            if (candidate / "meta.json").exists():
                warnings.warn(f"{folder} is missing (an interrupted save); loading {candidate}", stacklevel=3)
                return candidate
    raise FileNotFoundError(f"{folder} is not a complete checkpoint: no meta.json")


def load_checkpoint(dir: str | os.PathLike, state: TrainingState) -> dict:
    """Restore `state` from folder `dir`; returns {'iteration': int, 'extra': dict}.

    Everything is validated before the state changes. The optimizer's hyper-parameters stay the
    state's (its config); a checkpoint whose recorded ones differ gives a warning.
    """
    folder = _complete_folder(Path(dir))
    meta_path = folder / "meta.json"
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise ValueError(f"{folder}: not a {FORMAT} v{VERSION} checkpoint")
    if meta["mode"] != state.mode:
        raise ValueError(f"{folder}: checkpoint is {meta['mode']!r} mode, the state is {state.mode!r}")

    theta = state.theta_parameters()
    old = state.old_parameters()
    theta_saved = load_file(str(folder / "theta.safetensors"))
    old_saved = load_file(str(folder / "old.safetensors"))
    _check("theta", theta, theta_saved, folder)
    _check("old", old, old_saved, folder)
    if state.mode == "lora" and meta["lora_alpha"] != state.config.lora_alpha:
        raise ValueError(f"{folder}: lora_alpha {meta['lora_alpha']} in the checkpoint, {state.config.lora_alpha} here")

    optimizer_saved = load_file(str(folder / "optimizer.safetensors"))
    steps: dict[str, float] = meta["optimizer"]["step"]
    per_param: dict[str, dict[str, torch.Tensor]] = {name: {} for name in steps}
    for key, value in optimizer_saved.items():
        kind, _, name = key.partition("/")
        if name not in theta:
            raise ValueError(f"{folder}: optimizer state for unknown parameter {name!r}: the model differs")
        if value.shape != theta[name].shape:
            raise ValueError(
                f"{folder}: optimizer {kind} of {name!r} has shape {tuple(value.shape)}, "
                f"the parameter has {tuple(theta[name].shape)}"
            )
        if name not in per_param:
            raise ValueError(f"{folder}: optimizer tensors for {name!r} without a step count")
        per_param[name][kind] = value
    for name in steps:
        if name not in theta:
            raise ValueError(f"{folder}: optimizer step for unknown parameter {name!r}: the model differs")

    groups = meta["optimizer"]["param_groups"]
    current = state.optimizer.param_groups
    if len(groups) != len(current):
        raise ValueError(f"{folder}: {len(groups)} optimizer param groups, the state has {len(current)}")
    for saved, group in zip(groups, current, strict=True):
        for key in HYPER_PARAMS:
            if key in saved and _json_value(group[key]) != saved[key]:
                warnings.warn(
                    f"{folder}: optimizer {key} was {saved[key]} in the checkpoint; keeping the config's {group[key]}",
                    stacklevel=2,
                )

    rng = load_file(str(folder / "rng.safetensors"))

    # ---- everything checked: apply -------------------------------------------------------------
    with torch.no_grad():
        for name, param in theta.items():
            param.copy_(theta_saved[name])
        for name, param in old.items():
            param.copy_(old_saved[name])
    position = {id(p): i for i, p in enumerate(p for group in current for p in group["params"])}
    order = {name: position[id(param)] for name, param in theta.items()}
    optimizer_state = {
        order[name]: {"step": torch.tensor(float(steps[name])), **tensors} for name, tensors in per_param.items()
    }
    param_groups = []
    start = 0
    for group in current:
        count = len(group["params"])
        param_groups.append({**group, "params": list(range(start, start + count))})
        start += count
    state.optimizer.state.clear()
    state.optimizer.load_state_dict({"state": optimizer_state, "param_groups": param_groups})
    state.skipped_steps = int(meta["skipped_steps"])

    torch.set_rng_state(rng["torch_cpu"])
    cuda_states = [rng[k] for k in sorted((k for k in rng if k.startswith("cuda:")), key=lambda k: int(k[5:]))]
    if cuda_states:
        if torch.cuda.is_available() and torch.cuda.device_count() == len(cuda_states):
            torch.cuda.set_rng_state_all(cuda_states)
        else:
            warnings.warn(f"{folder}: CUDA RNG states of {len(cuda_states)} device(s) not restored", stacklevel=2)
    return {"iteration": int(meta["iteration"]), "extra": meta["extra"]}
