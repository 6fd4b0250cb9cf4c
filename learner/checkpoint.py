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
must not overwrite its last good checkpoint). `learner.checkpoint_load.verify_checkpoint` — which
`load_checkpoint` calls before touching the state — checks meta.json, every checksum and that every float is finite, and
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
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from learner.tensor_files import (
    NonFiniteWeights,
    check_finite,
    fsync_path,
    os_error_of,
    safetensors_metadata,
    write_safetensors,
)
from learner.training_state import TrainingState

__all__ = [
    "CHECKPOINT_DIR",
    "CheckpointWriteFailed",
    "CorruptCheckpoint",
    "NonFiniteWeights",
    "check_finite",
    "has_checkpoint",
    "previous_checkpoint",
    "safetensors_metadata",
    "save_checkpoint",
    "write_safetensors",
    "written_into",
]

CHECKPOINT_DIR = "checkpoint"  # a run directory's rotating pair: checkpoint/ and checkpoint.previous/
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
            one_line(f"could not write {what} {folder}: {_describe(error)}; removed {tmp}, {kept}"), folder,
            error.errno) from exc


def one_line(exc: BaseException | str) -> str:
    return " ".join(str(exc).split())


def previous_checkpoint(dir: str | os.PathLike) -> Path:
    """The folder the checkpoint before `dir`'s is kept in: ``<dir>.previous``."""
    path = Path(dir)
    return path.with_name(path.name + ".previous")


# ---- saving ------------------------------------------------------------------------------------
def json_value(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, torch.Tensor):
        return value.item()
    return value


def siblings(final: Path) -> tuple[Path, Path, Path]:
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
        {k: json_value(v) for k, v in group.items() if k != "params"} for group in state.optimizer.param_groups
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
    tmp, _, discard = siblings(final)
    if not final.exists() and (tmp / "meta.json").exists():
        tmp.rename(final)  # a save that died between its renames: finish it, so it becomes .previous below
    for stale in (tmp, discard):
        if stale.exists():
            shutil.rmtree(stale)
    return tmp


def _rotate_into_place(final: Path) -> None:
    """Renames only: `<dir>.previous` → `.discard`, `<dir>` → `.previous`, `.tmp` → `<dir>`; then the
    discarded one is deleted. A crash between them leaves a complete folder for `_complete_folder`."""
    tmp, previous, discard = siblings(final)
    if final.exists():
        if previous.exists():
            previous.rename(discard)
        final.rename(previous)
    tmp.rename(final)
    fsync_path(final.parent)
    if discard.exists():
        shutil.rmtree(discard)


def has_checkpoint(folder: str | os.PathLike) -> bool:
    """Anything a resume could start from: the folder, or the complete `.tmp` of an interrupted rotation
    (`checkpoint_load` verifies it)."""
    folder = Path(folder)
    return folder.exists() or siblings(folder)[0].exists()


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

