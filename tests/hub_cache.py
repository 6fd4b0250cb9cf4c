"""A Hugging Face hub cache on disk, laid out as huggingface_hub writes it, for tests that name repos offline.

    <cache>/models--org--name/blobs/<sha256>                       the files' contents
    <cache>/models--org--name/snapshots/<commit>/<path> → ../../blobs/<sha256>   (relative symlinks)
    <cache>/models--org--name/refs/main                            the commit the branch points at
(a dataset repo: datasets--org--name)
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_repo(cache: Path, repo: str, files: dict[str, bytes | Path], *, ref: str = "main",
               kind: str = "model") -> Path:
    """Put `files` (repo path → bytes, or a file to copy) into `cache` as commit `ref` of `repo` (a "model" or a
    "dataset" repo); the snapshot folder. The commit id is a hash of the contents: same files, same commit."""
    root = cache / f"{kind}s--{repo.replace('/', '--')}"
    contents = {name: data.read_bytes() if isinstance(data, Path) else data for name, data in sorted(files.items())}
    commit = hashlib.sha1(b"".join(name.encode() + hashlib.sha256(data).digest()
                                   for name, data in contents.items())).hexdigest()
    snapshot = root / "snapshots" / commit
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    for name, data in contents.items():
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / ref).write_text(commit)
    return snapshot


def folder_files(folder: Path, prefix: str = "") -> dict[str, Path]:
    """Every file under `folder` by its path relative to it (with `prefix`), for `cache_repo`."""
    return {prefix + path.relative_to(folder).as_posix(): path for path in sorted(folder.rglob("*")) if path.is_file()}
