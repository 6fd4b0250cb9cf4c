"""Reading reward checkpoints: safetensors, or an official pickled `.pt`/`.pth`/`.bin` read safely.

Several official reward checkpoints ship as pickles (`HPS_v2.1_compressed.pt`, `ImageReward.pt`,
`sac+logos+ava1-l14-linearMSE.pth`). Unpickling runs arbitrary code, so they are only ever read with
`torch.load(weights_only=True)`, which admits tensors and plain containers and refuses anything else;
`python -m rewards.convert` turns them into safetensors once, after which the safetensors file
beside the pickle is preferred.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


def converted_path(path: str | Path) -> Path:
    """Where `python -m rewards.convert` writes the safetensors twin of a pickled checkpoint."""
    return Path(path).with_suffix(".safetensors")


def checkpoint_on_disk(pickled: str | Path) -> Path:
    """The file a reward requires for an official pickled checkpoint: its safetensors twin when that is
    there (`load_state_dict` reads it first), else the pickle (named as missing when neither is)."""
    twin = converted_path(pickled)
    return twin if twin.is_file() else Path(pickled)


def state_dict_of(loaded: object, path: Path) -> dict[str, torch.Tensor]:
    """The name → tensor mapping of an unpickled checkpoint (bare, or under "state_dict" / "model")."""
    # Official checkpoints are either a bare state dict or {"state_dict": ...} / {"model": ...}.
    if isinstance(loaded, Mapping):
        for key in ("state_dict", "model"):
            if key in loaded and isinstance(loaded[key], Mapping):
                loaded = loaded[key]
                break
    if not isinstance(loaded, Mapping) or not all(isinstance(v, torch.Tensor) for v in loaded.values()):
        raise ValueError(f"{path} does not hold a state dict (a mapping of names to tensors)")
    return {str(name): tensor for name, tensor in loaded.items()}


def load_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint file, on the CPU.

    `.safetensors` is read directly; a pickle is read through its safetensors twin when
    `rewards.convert` made one, else with `torch.load(weights_only=True)` (never a full unpickle).
    """
    path = Path(path)
    if path.suffix == ".safetensors":
        return load_file(path)
    twin = converted_path(path)
    if twin.is_file():
        return load_file(twin)
    if path.suffix not in PICKLE_SUFFIXES:
        raise ValueError(f"{path}: unknown checkpoint format {path.suffix!r}; expected .safetensors or "
                         f"one of {', '.join(PICKLE_SUFFIXES)}")
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises UnpicklingError subclasses and RuntimeError alike
        raise ValueError(f"{path} cannot be read as plain tensors (torch.load(weights_only=True) refused it: "
                         f"{error}); it is not an official checkpoint, or it holds code") from error
    return state_dict_of(loaded, path)


def convert_to_safetensors(path: str | Path) -> Path:
    """Write the safetensors twin of a pickled checkpoint (contiguous, un-shared tensors); its path."""
    path = Path(path)
    tensors = {name: tensor.detach().contiguous().clone() for name, tensor in load_state_dict(path).items()}
    out = converted_path(path)
    save_file(tensors, out)
    return out
