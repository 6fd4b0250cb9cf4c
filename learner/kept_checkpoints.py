"""Checkpoints kept beyond the rotating pair, and which checkpoint a name picks.

A run keeps its last two checkpoints (`checkpoint/`, `checkpoint.previous/`, `learner.checkpoint`); with
`run.keep_every: N` every N-th is also kept, for good, in `kept/iteration-N/` — a copy of the one just written
(hard links: no second copy of the bytes), verified by its own checksums before it is renamed into place.
`cluster.export --checkpoint N` and `cluster.evaluate --checkpoint N` name them by iteration.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from learner.checkpoint import (
    CHECKPOINT_DIR,
    CorruptCheckpoint,
    checkpoint_iteration,
    previous_checkpoint,
    written_into,
)
from learner.checkpoint_load import verify_checkpoint

KEPT_DIR = "kept"  # every run.keep_every-th checkpoint: kept/iteration-000040/

def kept_name(iteration: int) -> str:
    return f"iteration-{iteration:06d}"


def keep_checkpoint(checkpoint: Path, run_dir: Path) -> Path:
    """A lasting copy of the verified `checkpoint` folder as run_dir/kept/iteration-N (N: its iteration), beside
    the rotating pair that a later save replaces. Files are hard links where the file system allows (no second
    copy of the bytes; the rotation renames folders, never rewrites a file), else copies; written as a `.tmp`
    sibling, verified against its own checksums like any checkpoint, then renamed into place."""
    iteration = checkpoint_iteration(checkpoint)
    if iteration is None:
        raise CorruptCheckpoint(f"{checkpoint} has no readable meta.json: there is nothing to keep")
    target = run_dir / KEPT_DIR / kept_name(iteration)
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with written_into(tmp, target, "the kept checkpoint", "the rotating checkpoints are unchanged"):
        tmp.mkdir(parents=True)
        for file in sorted(checkpoint.iterdir()):
            try:
                os.link(file, tmp / file.name)
            except OSError:  # another file system, or one without hard links
                shutil.copyfile(file, tmp / file.name)
        verify_checkpoint(tmp)
    if target.exists():  # a resume that passed this iteration again: the new one replaces it
        shutil.rmtree(target)
    tmp.rename(target)
    return target


def kept_checkpoints(run_dir: Path) -> dict[int, Path]:
    """The kept checkpoints of a run, by iteration."""
    folder = run_dir / KEPT_DIR
    found = {}
    for path in sorted(folder.glob("iteration-*")) if folder.is_dir() else []:
        if path.suffix != ".tmp" and (iteration := checkpoint_iteration(path)) is not None:
            found[iteration] = path
    return found


def named_checkpoint(run_dir: Path, which: str) -> Path:
    """The checkpoint folder `which` names: latest, previous (the rotating pair), or an iteration N (a kept one,
    `run.keep_every`, or either of the pair when it is at N). ValueError naming what the run has otherwise."""
    latest = run_dir / CHECKPOINT_DIR
    if which == "latest":
        return latest
    if which == "previous":
        return previous_checkpoint(latest)
    if not which.isdigit():
        raise ValueError(f"--checkpoint {which}: give latest, previous or an iteration number")
    wanted = int(which)
    pair = {n: folder for folder in (previous_checkpoint(latest), latest)
            if (n := checkpoint_iteration(folder)) is not None}
    found = {**pair, **kept_checkpoints(run_dir)}
    if wanted not in found:
        have = ", ".join(map(str, sorted(found))) or "none"
        raise ValueError(f"--checkpoint {wanted}: {run_dir} has no checkpoint of iteration {wanted} (it has: {have}); "
                         "run.keep_every=N keeps every N-th one")
    return found[wanted]
