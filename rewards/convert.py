"""Write the safetensors twin of pickled reward checkpoints (HPS_v2.1_compressed.pt, ImageReward.pt, …).

    python -m rewards.convert FILE [FILE ...]          FILE.pt → FILE.safetensors beside it
    python -m rewards.convert --force FILE [FILE ...]  rewrite twins that already exist
    python -m rewards.convert --check FILE [FILE ...]  does each twin hold exactly its pickle's tensors?

Each FILE is read only with `torch.load(weights_only=True)` (through `rewards.state_dicts`), which
admits tensors and plain containers and refuses any other object before constructing it: a pickle that
would run code is refused, and none of it runs. The tensors of its state dict (a bare one, or the one
under "state_dict" / "model") are written with `rewards.state_dicts.convert_to_safetensors`; rewards
then read the twin instead of the pickle. For each file written the twin's name, its tensor count and
its size in bytes are printed.

Exit status: 0 when every file was converted (or its twin kept, or checked equal); 1 when `--check`
finds a twin missing or different; 2 when a file was refused (missing, not a pickle, not readable by
`torch.load(weights_only=True)`, or not a state dict). Every file is attempted either way.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file

from rewards.state_dicts import PICKLE_SUFFIXES, convert_to_safetensors, converted_path, state_dict_of

OK, DIFFERENT, REFUSED = 0, 1, 2


class Refused(Exception):
    """A file this tool will not read."""


def _check_pickle_path(path: Path) -> None:
    if not path.is_file():
        raise Refused(f"{path}: no such file")
    if path.suffix not in PICKLE_SUFFIXES:
        raise Refused(f"{path}: not a pickled checkpoint (expected one of {', '.join(PICKLE_SUFFIXES)})")


def read_pickle(path: Path) -> dict[str, torch.Tensor]:
    """The pickle's state dict, read with torch.load(weights_only=True) itself (never through its twin)."""
    _check_pickle_path(path)
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises UnpicklingError subclasses and RuntimeError alike
        raise Refused(f"{path}: torch.load(weights_only=True) refused it ({error}); "
                      f"it is not an official checkpoint, or it holds code") from error
    try:
        return state_dict_of(loaded, path)
    except ValueError as error:
        raise Refused(str(error)) from error


def describe(twin: Path) -> str:
    return f"{twin}: {len(load_file(twin))} tensors, {twin.stat().st_size} bytes"


def convert(path: Path, force: bool = False) -> str:
    """Write the twin of `path` (kept as it is when it exists, unless `force`); what was done, in words."""
    _check_pickle_path(path)
    twin = converted_path(path)
    if twin.exists() and not force:
        return f"kept {describe(twin)} (exists; --force rewrites it)"
    # convert_to_safetensors reads an existing twin instead of the pickle: move it aside meanwhile.
    previous = twin.with_name(twin.name + ".previous")
    if twin.exists():
        twin.replace(previous)
    try:
        written = convert_to_safetensors(path)
    except ValueError as error:
        if previous.exists():
            previous.replace(twin)
        raise Refused(str(error)) from error
    except BaseException:
        if previous.exists():
            previous.replace(twin)
        raise
    previous.unlink(missing_ok=True)
    return f"wrote {describe(written)} from {path}"


def check(path: Path) -> tuple[int, str]:
    """(status, message): whether the twin of `path` holds exactly the pickle's tensors."""
    twin = converted_path(path)
    tensors = read_pickle(path)
    if not twin.is_file():
        return DIFFERENT, f"{path}: no twin {twin}"
    saved = load_file(twin)
    if set(saved) != set(tensors):
        return DIFFERENT, f"{twin}: tensor names differ from {path} ({len(saved)} vs {len(tensors)} tensors)"
    for name, tensor in tensors.items():
        other = saved[name]
        if other.dtype != tensor.dtype or other.shape != tensor.shape or not torch.equal(other, tensor):
            return DIFFERENT, f"{twin}: tensor {name!r} differs from {path}"
    return OK, f"{twin}: equal to {path} ({len(tensors)} tensors)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rewards.convert",
        description="Write the safetensors twin of pickled reward checkpoints (read with weights_only=True).")
    parser.add_argument("files", nargs="+", type=Path, metavar="FILE",
                        help=f"pickled checkpoints ({', '.join(PICKLE_SUFFIXES)})")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--force", action="store_true", help="rewrite twins that already exist")
    mode.add_argument("--check", action="store_true", help="only compare each twin with its pickle")
    args = parser.parse_args(argv)

    status = OK
    for path in args.files:
        try:
            if args.check:
                result, message = check(path)
                status = max(status, result)
            else:
                message = convert(path, force=args.force)
        except Refused as error:
            print(f"refused {error}", file=sys.stderr)
            status = REFUSED
            continue
        print(message)
    return status


if __name__ == "__main__":
    sys.exit(main())
