"""Checkpoints of a `TrainingState`: safetensors and JSON only (never pickle), verified before use.

A checkpoint is a folder:

* ``theta.safetensors`` / ``old.safetensors``: θ's trainable parameters and θ_old's (LoRA: the
  adapter parameters, named without the adapter segment; full mode: all parameters);
* ``optimizer.safetensors``: AdamW's per-parameter tensors, keyed ``<state>/<param name>``
  (``exp_avg/…``, ``exp_avg_sq/…``);
* ``rng.safetensors``: the torch CPU RNG state (uint8) and, on CUDA, each device's;
* ``ema.safetensors`` (when the state keeps an EMA of θ): the average, named as θ's parameters;
* ``meta.json`` (written last): format and version, the SHA-256 and size of each of the four files,
  mode and LoRA settings, parameter shapes, AdamW step counts and hyper-parameters,
  ``skipped_steps``, the iteration and the caller's ``extra`` dict.

Integrity. Saving refuses non-finite floats in θ, θ_old and the optimizer state (a run that diverged
must not overwrite its last good checkpoint). `verify_checkpoint` — which `load_checkpoint` calls
before touching the state — checks meta.json, every checksum and that every float is finite, and
raises `CorruptCheckpoint` with one line naming the file and the problem; when the previous
checkpoint verifies, the line says so. Version-1 checkpoints (no checksums) are refused.

The last two checkpoints are kept: ``<dir>`` and ``<dir>.previous``. Saving writes ``<dir>.tmp``
(``meta.json`` last, itself renamed into place) — a write the file system refuses (a full disk) removes
``<dir>.tmp`` and raises `CheckpointWriteFailed`, one line naming the folder and the OS error, with
``<dir>`` and ``<dir>.previous`` untouched — and then rotates with renames only: an existing
``<dir>.previous`` goes to ``<dir>.discard`` (deleted at the end), ``<dir>`` becomes
``<dir>.previous``, ``<dir>.tmp`` becomes ``<dir>``. A crash therefore never leaves a half-written
``<dir>``; if it falls between the last two renames, loading ``<dir>`` takes the complete ``<dir>.tmp``
(or ``<dir>.previous``), and the next save first finishes the interrupted rotation.

Files are written with `learner.tensor_files.write_safetensors` (deterministic bytes).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_safetensors_bytes

from learner.tensor_files import (
    NonFiniteWeights,
    check_finite,
    fsync_path,
    non_finite,
    os_error_of,
    safetensors_metadata,
    write_safetensors,
)
from learner.training_state import TrainingState

__all__ = [
    "CheckpointWriteFailed", "CorruptCheckpoint", "NonFiniteWeights", "check_finite", "load_checkpoint",
    "previous_checkpoint", "safetensors_metadata", "save_checkpoint", "verify_checkpoint", "write_safetensors",
    "written_into",
]

FORMAT = "sol-rl-training-state"
VERSION = 2  # 2: checksums of every file in meta.json
HYPER_PARAMS = ("lr", "betas", "weight_decay", "eps")
FILES = ("theta.safetensors", "old.safetensors", "optimizer.safetensors", "rng.safetensors")
EMA_FILE = "ema.safetensors"  # optional: listed in meta.json when written
FLOAT_FILES = (*FILES[:3], EMA_FILE)  # rng is uint8


class CorruptCheckpoint(ValueError):
    """A checkpoint that must not be trusted; the message is one line naming the file and the problem."""


class CheckpointWriteFailed(OSError):
    """A checkpoint (or the run's final/ folder) the file system would not take: a full disk, a file size
    limit, a read-only folder. Raised once the partial folder is removed; what was there before is intact.

    The message is one line naming the folder, the OS error and what is kept, e.g. ``"could not write the
    checkpoint runs/x/checkpoint: No space left on device (runs/x/checkpoint.tmp/theta.safetensors); removed
    runs/x/checkpoint.tmp, the previous checkpoint runs/x/checkpoint (iteration 4) is intact"``. `folder`: the
    folder that was to be written; `errno`: the OS error's."""

    def __init__(self, message: str, folder: str | os.PathLike | None = None, errno: int | None = None) -> None:
        super().__init__(message)
        self.folder = None if folder is None else Path(folder)
        self.errno = errno

    def __reduce__(self) -> tuple:  # pickled across Ray (a learner actor raises it): keep folder and errno
        return type(self), (str(self), self.folder, self.errno)


def _describe(error: OSError) -> str:
    return f"{error.strerror or error}" + (f" ({error.filename})" if error.filename else "")


@contextlib.contextmanager
def written_into(tmp: Path, folder: Path, what: str, kept: str) -> Iterator[Path]:
    """The writes of `what` (e.g. "the checkpoint") `folder` into its temporary sibling `tmp`, renamed into
    place by the caller afterwards. On any failure `tmp` is removed; an OS error (a full disk, ...:
    `os_error_of`) becomes `CheckpointWriteFailed` naming the folder, the error and `kept` (what is intact)."""
    try:
        yield tmp
    except Exception as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        error = os_error_of(exc, tmp)  # a SafetensorError of a library's own writer names no file: the folder
        if error is None or isinstance(exc, CheckpointWriteFailed):
            raise
        raise CheckpointWriteFailed(
            _one_line(f"could not write {what} {folder}: {_describe(error)}; removed {tmp}, {kept}"), folder,
            error.errno) from exc


def previous_checkpoint(dir: str | os.PathLike) -> Path:
    """The folder the checkpoint before `dir`'s is kept in: ``<dir>.previous``."""
    path = Path(dir)
    return path.with_name(path.name + ".previous")


# ---- saving ------------------------------------------------------------------------------------
def _json_value(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, torch.Tensor):
        return value.item()
    return value


def _siblings(final: Path) -> tuple[Path, Path, Path]:
    """<dir>.tmp (being written), <dir>.previous (kept), <dir>.discard (being deleted)."""
    return (final.with_name(final.name + ".tmp"), previous_checkpoint(final),
            final.with_name(final.name + ".discard"))


def save_checkpoint(dir: str | os.PathLike, state: TrainingState, *, iteration: int, extra: dict | None = None) -> Path:
    """Write `state` (+ iteration, extra) to folder `dir` atomically, keeping the one it replaces as
    ``<dir>.previous``; returns the folder. Raises `NonFiniteWeights` (writing nothing) when θ, θ_old
    or the optimizer state holds NaN or ±inf."""
    final = Path(dir)
    extra = _serialisable(extra)
    theta = state.theta_parameters()
    old = state.old_parameters()
    optimizer_tensors, optimizer_steps = _optimizer_contents(state, theta)
    contents = _finite_contents(final, state, theta, old, optimizer_tensors)
    groups = [
        {k: _json_value(v) for k, v in group.items() if k != "params"} for group in state.optimizer.param_groups
    ]
    contents["rng.safetensors"] = _rng_states()

    tmp = _clear_siblings(final)
    with written_into(tmp, final, "the checkpoint", _kept_checkpoint(final)):
        _write_folder(tmp, contents, _meta(state, theta, groups, optimizer_steps, iteration, extra))
    _rotate_into_place(final)
    return final


def _serialisable(extra: dict | None) -> dict:
    """A copy of the caller's `extra`, refused before anything is written unless meta.json can hold it."""
    extra = dict(extra or {})
    try:
        json.dumps(extra)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"save_checkpoint: extra must be JSON-serialisable: {exc}") from exc
    return extra


def _optimizer_contents(state: TrainingState, theta: dict[str, torch.Tensor]
                        ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """AdamW's per-parameter tensors keyed ``<state>/<param name>`` and its step counts by parameter name:
    the optimizer keys its state by parameter object, which does not survive a restart."""
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
    return optimizer_tensors, optimizer_steps


def _finite_contents(final: Path, state: TrainingState, theta: dict, old: dict,
                     optimizer_tensors: dict) -> dict[str, dict[str, torch.Tensor]]:
    """The tensors of each file (rng's still empty), refused if any float is not finite: a run that
    diverged must not replace its last good checkpoint."""
    contents = dict(zip(FILES, (theta, old, optimizer_tensors, {}), strict=True))
    if state.ema is not None:
        contents[EMA_FILE] = state.ema.average
    for label, tensors in (("theta", theta), ("old", old), ("optimizer state", optimizer_tensors),
                           ("EMA", contents.get(EMA_FILE, {}))):
        check_finite(tensors, f"save_checkpoint: refusing to write non-finite {label} to {final}")
    return contents


def _rng_states() -> dict[str, torch.Tensor]:
    """The torch CPU RNG state and, once CUDA is initialised, each device's."""
    rng = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # untouched CUDA: no CUDA RNG was used
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            rng[f"cuda:{i}"] = s
    return rng


def _clear_siblings(final: Path) -> Path:
    """Ready `<dir>.tmp` to be written (returned): first finish a save that died between its renames, then
    remove what an earlier crash left in `.tmp` and `.discard`."""
    tmp, _, discard = _siblings(final)
    if not final.exists() and (tmp / "meta.json").exists():
        tmp.rename(final)  # a save that died between its renames: finish it, so it becomes .previous below
    for stale in (tmp, discard):
        if stale.exists():
            shutil.rmtree(stale)
    return tmp


def _rotate_into_place(final: Path) -> None:
    """Renames only: `<dir>.previous` → `.discard`, `<dir>` → `.previous`, `.tmp` → `<dir>`; then the
    discarded one is deleted. A crash between them leaves a complete folder for `_complete_folder`."""
    tmp, previous, discard = _siblings(final)
    if final.exists():
        if previous.exists():
            previous.rename(discard)
        final.rename(previous)
    tmp.rename(final)
    fsync_path(final.parent)
    if discard.exists():
        shutil.rmtree(discard)


def checkpoint_iteration(folder: str | os.PathLike) -> int | None:
    """The iteration a checkpoint folder's meta.json names, read without verifying anything (None: no
    readable meta.json): for messages, never for loading."""
    try:
        return int(json.loads((Path(folder) / "meta.json").read_text())["iteration"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _kept_checkpoint(final: Path) -> str:
    """What a failed save leaves in use: the checkpoint `final` holds now (its iteration), if any."""
    if not (final / "meta.json").is_file():
        return "there is no earlier checkpoint"
    iteration = checkpoint_iteration(final)
    if iteration is None:
        return f"the previous checkpoint {final} is unchanged"
    return f"the previous checkpoint {final} (iteration {iteration}) is intact"


def _meta(state: TrainingState, theta: dict, groups: list, optimizer_steps: dict[str, float], iteration: int,
          extra: dict) -> dict:
    """meta.json's fields but the files' checksums (added by `_write_folder`)."""
    return {
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


def _write_folder(tmp: Path, contents: dict[str, dict[str, torch.Tensor]], meta: dict) -> None:
    """Every file of a checkpoint into the new folder `tmp`, meta.json (with the files' checksums) last."""
    tmp.mkdir(parents=True)
    files = {}
    for name, tensors in contents.items():
        digest = write_safetensors(tmp / name, tensors, {"format": FORMAT}, fsync=True)
        files[name] = {"sha256": digest, "bytes": (tmp / name).stat().st_size}
    meta = {"format": meta["format"], "version": meta["version"], "files": files, **meta}  # meta.json's order
    # meta.json appears whole or not at all: its presence is what marks a folder complete.
    partial = tmp / "meta.json.partial"
    partial.write_text(json.dumps(meta, indent=1))
    fsync_path(partial)
    partial.rename(tmp / "meta.json")
    fsync_path(tmp)


# ---- verifying ---------------------------------------------------------------------------------
def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


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
        raise CorruptCheckpoint(f"{meta_path}: unreadable ({_one_line(exc)})") from None
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
        problems.append(f"not a readable safetensors file ({_one_line(exc)})")
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
        tmp, previous, _ = _siblings(folder)
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
            if key in saved and _json_value(group[key]) != saved[key]:
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
