"""Reading a checkpoint back (`learner.checkpoint` writes it): verified before the state is touched.

`verify_checkpoint` checks meta.json, every file's checksum and that every float is finite, and raises
`CorruptCheckpoint` in one line naming the file (and whether the previous checkpoint verifies);
`load_checkpoint` verifies, checks that the checkpoint fits the state (mode, names, shapes, dtypes,
LoRA settings, optimizer groups), and only then restores θ, θ_old, AdamW, the EMA and the RNG.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path

import torch
from safetensors.torch import load as load_safetensors_bytes

from learner.checkpoint import (
    EMA_FILE,
    FILES,
    FLOAT_FILES,
    FORMAT,
    HYPER_PARAMS,
    VERSION,
    CorruptCheckpoint,
    json_value,
    one_line,
    previous_checkpoint,
    siblings,
)
from learner.tensor_files import non_finite
from learner.training_state import TrainingState


def _verify(folder: Path) -> tuple[dict, dict[str, dict[str, torch.Tensor]]]:
    """meta.json and the tensors of every file, all checked; raises CorruptCheckpoint (no hint)."""
    meta = _read_meta(folder)
    listed: dict = meta["files"]
    loaded: dict[str, dict[str, torch.Tensor]] = {}
    for name in (*FILES, *([EMA_FILE] if EMA_FILE in listed else [])):
        loaded[name] = _read_verified(folder / name, listed[name], floats=name in FLOAT_FILES)
    return meta, loaded


def _read_meta(folder: Path) -> dict:
    """`folder`'s meta.json, of this format and version and listing a checksum of every required file."""
    if not folder.is_dir():
        raise CorruptCheckpoint(f"{folder}: no checkpoint folder there")
    meta_path = folder / "meta.json"
    if not meta_path.is_file():
        raise CorruptCheckpoint(f"{meta_path}: missing (the checkpoint is incomplete)")
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptCheckpoint(f"{meta_path}: unreadable ({one_line(exc)})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CorruptCheckpoint(f"{meta_path}: not a {FORMAT} checkpoint")
    version = meta.get("version")
    if version != VERSION or not isinstance(meta.get("files"), dict):
        if isinstance(version, int) and version < VERSION:
            raise CorruptCheckpoint(
                f"{meta_path}: a version {version} checkpoint has no checksums, so it cannot be verified and is "
                f"not loaded (this code reads version {VERSION})")
        if version == VERSION:
            raise CorruptCheckpoint(f"{meta_path}: no 'files' checksums (meta.json was altered)")
        raise CorruptCheckpoint(f"{meta_path}: checkpoint format version {version!r}, this code reads {VERSION}")
    for name in FILES:
        if name not in meta["files"]:
            raise CorruptCheckpoint(f"{meta_path}: has no checksum of {name} (meta.json was altered)")
    return meta


def _read_verified(path: Path, expected: dict, *, floats: bool) -> dict[str, torch.Tensor]:
    """The tensors of `path`, whose bytes must hash to what meta.json recorded, parse, and (`floats`) be
    finite; every problem found goes into the one line of the CorruptCheckpoint."""
    if not path.is_file():
        raise CorruptCheckpoint(f"{path}: missing")
    data = path.read_bytes()  # what is hashed is what is loaded: no second read in between
    problems = []
    if hashlib.sha256(data).hexdigest() != expected.get("sha256"):
        problems.append("checksum mismatch (the file changed after it was written)" if len(data) ==
                        expected.get("bytes") else f"checksum mismatch (the file changed after it was "
                        f"written: {len(data)} bytes, {expected.get('bytes')} when written)")
    try:
        tensors = load_safetensors_bytes(data)
    except Exception as exc:  # whatever the damage, the parser's complaint goes into the one line
        problems.append(f"not a readable safetensors file ({one_line(exc)})")
    else:
        if floats:
            problem = non_finite(dict(sorted(tensors.items())))
            if problem is not None:
                problems.append(problem)
    if problems:
        raise CorruptCheckpoint(f"{path}: {'; '.join(problems)}")
    return tensors


def _verified(folder: Path, checkpoint: Path) -> tuple[dict, dict[str, dict[str, torch.Tensor]]]:
    """`_verify(folder)`; a failure names `checkpoint`'s previous one when that one verifies."""
    try:
        return _verify(folder)
    except CorruptCheckpoint as exc:
        message = str(exc)
        previous = previous_checkpoint(checkpoint)
        if previous != folder and previous.is_dir():
            try:
                meta, _ = _verify(previous)
            except CorruptCheckpoint:
                pass
            else:
                message += f"; the previous checkpoint {previous} (iteration {meta['iteration']}) verifies"
        raise CorruptCheckpoint(message) from None


def verify_checkpoint(dir: str | os.PathLike) -> dict:
    """Check the checkpoint folder `dir` without a TrainingState; returns its parsed meta.json.

    Checked: meta.json is present, parseable and of this format and version; each file it lists
    exists with the SHA-256 recorded at save time; every float in θ, θ_old and the optimizer state
    is finite. Raises `CorruptCheckpoint` otherwise, e.g. ``"runs/x/checkpoint/theta.safetensors:
    checksum mismatch (the file changed after it was written); the previous checkpoint
    runs/x/checkpoint.previous (iteration 4) verifies"``.
    """
    folder = Path(dir)
    return _verified(folder, folder)[0]


# ---- loading -----------------------------------------------------------------------------------
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
    """`folder`, or — when a save died between its last two renames — its complete `.tmp` or `.previous`."""
    if (folder / "meta.json").exists():
        return folder
    if not folder.exists():
        tmp, previous, _ = siblings(folder)
        for candidate in (tmp, previous):  # .tmp has meta.json only once complete; it is the newer one
            if (candidate / "meta.json").exists():
                warnings.warn(f"{folder} is missing (an interrupted save); loading {candidate}", stacklevel=3)
                return candidate
    raise FileNotFoundError(f"{folder} is not a complete checkpoint: no meta.json")


def load_checkpoint(dir: str | os.PathLike, state: TrainingState) -> dict:
    """Restore `state` from folder `dir`; returns {'iteration': int, 'extra': dict}.

    The folder is verified first (`verify_checkpoint`: `CorruptCheckpoint` names the damaged file),
    then matched against the state; nothing changes unless all of it passes. The optimizer's
    hyper-parameters stay the state's (its config); a checkpoint whose recorded ones differ gives a
    warning.
    """
    folder = _complete_folder(Path(dir))
    meta, loaded = _verified(folder, Path(dir))
    if meta["mode"] != state.mode:
        raise ValueError(f"{folder}: checkpoint is {meta['mode']!r} mode, the state is {state.mode!r}")

    theta = state.theta_parameters()
    old = state.old_parameters()
    _check_parameters(folder, meta, loaded, state, theta, old)
    per_param = _saved_optimizer_state(folder, meta["optimizer"]["step"], loaded["optimizer.safetensors"], theta)
    _check_param_groups(folder, meta["optimizer"]["param_groups"], state.optimizer.param_groups)
    ema_saved = _saved_ema(folder, loaded.get(EMA_FILE), state, theta)

    # ---- everything checked: apply -------------------------------------------------------------
    _restore_parameters(state, theta, old, loaded["theta.safetensors"], loaded["old.safetensors"], ema_saved)
    _restore_optimizer(state, theta, per_param, meta["optimizer"]["step"])
    state.skipped_steps = int(meta["skipped_steps"])
    _restore_rng(folder, loaded["rng.safetensors"])
    return {"iteration": int(meta["iteration"]), "extra": meta["extra"]}


def _check_parameters(folder: Path, meta: dict, loaded: dict[str, dict[str, torch.Tensor]], state: TrainingState,
                      theta: dict[str, torch.Tensor], old: dict[str, torch.Tensor]) -> None:
    """θ's and θ_old's saved tensors are the state's names, shapes and dtypes; LoRA's scale is the same."""
    _check("theta", theta, loaded["theta.safetensors"], folder)
    _check("old", old, loaded["old.safetensors"], folder)
    if state.mode == "lora" and meta["lora_alpha"] != state.config.lora_alpha:
        raise ValueError(f"{folder}: lora_alpha {meta['lora_alpha']} in the checkpoint, {state.config.lora_alpha} here")


def _saved_optimizer_state(folder: Path, steps: dict[str, float], optimizer_saved: dict[str, torch.Tensor],
                           theta: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """The saved AdamW tensors by parameter name, each parameter's matching θ's and having a step count."""
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
    return per_param


def _check_param_groups(folder: Path, groups: list[dict], current: list[dict]) -> None:
    """As many param groups as the state's; a recorded hyper-parameter that differs from the config's only
    warns, since the config's is the one kept."""
    if len(groups) != len(current):
        raise ValueError(f"{folder}: {len(groups)} optimizer param groups, the state has {len(current)}")
    for saved, group in zip(groups, current, strict=True):
        for key in HYPER_PARAMS:
            if key in saved and json_value(group[key]) != saved[key]:
                warnings.warn(
                    f"{folder}: optimizer {key} was {saved[key]} in the checkpoint; keeping the config's {group[key]}",
                    stacklevel=3,
                )


def _saved_ema(folder: Path, ema_saved: dict[str, torch.Tensor] | None, state: TrainingState,
               theta: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """The saved EMA (None: none saved), checked against θ when the state keeps one."""
    if state.ema is not None and ema_saved is not None:
        _check("ema", theta, ema_saved, folder)
    elif state.ema is not None:
        warnings.warn(f"{folder}: no EMA of θ in this checkpoint; the EMA restarts from θ", stacklevel=3)
    return ema_saved


def _restore_parameters(state: TrainingState, theta: dict[str, torch.Tensor], old: dict[str, torch.Tensor],
                        theta_saved: dict[str, torch.Tensor], old_saved: dict[str, torch.Tensor],
                        ema_saved: dict[str, torch.Tensor] | None) -> None:
    """θ, θ_old and the EMA (θ's saved values when the checkpoint has none) copied in place."""
    with torch.no_grad():
        for name, param in theta.items():
            param.copy_(theta_saved[name])
        for name, param in old.items():
            param.copy_(old_saved[name])
        if state.ema is not None:
            for name, average in state.ema.average.items():
                average.copy_(ema_saved[name] if ema_saved is not None else theta_saved[name])


def _restore_optimizer(state: TrainingState, theta: dict[str, torch.Tensor],
                       per_param: dict[str, dict[str, torch.Tensor]], steps: dict[str, float]) -> None:
    """The saved AdamW state, keyed back from parameter names to the optimizer's positions; the param
    groups (hyper-parameters included) stay the state's."""
    current = state.optimizer.param_groups
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


def _restore_rng(folder: Path, rng: dict[str, torch.Tensor]) -> None:
    """The torch CPU RNG state and, when this machine has as many CUDA devices as were saved, theirs."""
    torch.set_rng_state(rng["torch_cpu"])
    cuda_states = [rng[k] for k in sorted((k for k in rng if k.startswith("cuda:")), key=lambda k: int(k[5:]))]
    if cuda_states:
        if torch.cuda.is_available() and torch.cuda.device_count() == len(cuda_states):
            torch.cuda.set_rng_state_all(cuda_states)
        else:
            warnings.warn(f"{folder}: CUDA RNG states of {len(cuda_states)} device(s) not restored", stacklevel=3)
