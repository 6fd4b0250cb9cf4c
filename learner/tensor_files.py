"""Tensor files of the project: finite values checked before writing, safetensors with deterministic bytes.

A write the disk refuses is an OSError (`os_error_of`: safetensors reports it only as text).

Every safetensors file this project writes goes through `write_safetensors`: the library keeps the
header's metadata in a hash map (its key order, hence the file's bytes, varies between calls), so
the metadata is one key holding sorted JSON and identical tensors give identical bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

METADATA_KEY = "sol_rl"  # the one safetensors metadata key this project writes


class NonFiniteWeights(ValueError):
    """Weights (or optimizer state) with NaN or ±inf, refused before they are written or published."""


def non_finite(tensors: Mapping[str, torch.Tensor]) -> str | None:
    """None if every floating-point tensor is finite; else which one is not, e.g.
    ``"16 non-finite values in 'x.weight'"`` (+ ``" (and 2 more tensors)"``), the first in order."""
    bad: list[tuple[str, int]] = []
    for name, tensor in tensors.items():
        if not (tensor.is_floating_point() or tensor.is_complex()):
            continue
        finite = torch.isfinite(tensor.detach())
        if not bool(finite.all()):
            bad.append((name, int(finite.numel() - finite.sum())))
    if not bad:
        return None
    name, count = bad[0]
    text = f"{count} non-finite value{'s' if count != 1 else ''} in {name!r}"
    if len(bad) > 1:
        text += f" (and {len(bad) - 1} more tensor{'s' if len(bad) > 2 else ''})"
    return text


def check_finite(tensors: Mapping[str, torch.Tensor], what: str) -> None:
    """Raise `NonFiniteWeights` ``"<what>: <n> non-finite values in '<name>'"`` unless all are finite."""
    problem = non_finite(tensors)
    if problem is not None:
        raise NonFiniteWeights(f"{what}: {problem}")


_OS_ERROR = re.compile(r"\(os error (\d+)\)")  # how safetensors' Rust I/O errors end: "... (os error 28)"


def os_error_of(exc: BaseException, path: str | os.PathLike | None = None) -> OSError | None:
    """The OS error behind a failed write: `exc` itself when it is one; for safetensors' `SafetensorError`
    (it reports the I/O error only in its text, "I/O error: No space left on device (os error 28)") an
    OSError with that errno and `path`; None for any other error."""
    if isinstance(exc, OSError):
        return exc
    found = _OS_ERROR.search(str(exc)) if isinstance(exc, SafetensorError) else None
    if found is None:
        return None
    code = int(found.group(1))
    return OSError(code, os.strerror(code), None if path is None else str(path))


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_safetensors(
    path: str | os.PathLike, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, Any] | None = None,
    *, fsync: bool = False,
) -> str:
    """Write `tensors` (moved to CPU, contiguous) to `path` with deterministic bytes; returns its SHA-256.

    `metadata` (JSON-serialisable) is stored as sorted JSON under the single key ``"sol_rl"``: with
    several keys the library's hash map writes them in a varying order. Read it back with
    `safetensors_metadata`. A write the file system refuses (a full disk) raises OSError naming `path`.
    """
    out = Path(path)
    cpu = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    header = {METADATA_KEY: json.dumps(dict(metadata or {}), sort_keys=True, separators=(",", ":"))}
    try:
        save_file(cpu, str(out), metadata=header)
    except SafetensorError as exc:
        error = os_error_of(exc, out)
        if error is None:
            raise
        raise error from exc
    if fsync:
        fsync_path(out)
    return _sha256(out)


def safetensors_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The metadata `write_safetensors` stored in `path` ({} when there is none)."""
    with safe_open(str(path), framework="pt") as f:
        stored = f.metadata() or {}
    return json.loads(stored[METADATA_KEY]) if METADATA_KEY in stored else {}
