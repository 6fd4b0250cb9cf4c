"""Export a run as a diffusers pipeline folder.

    python -m cluster.export --run-dir D --out DIR [--policy theta|ema|old] [--checkpoint latest|previous]

Reads the run's `config.yaml` and its verified checkpoint (nothing in the run directory changes), merges
the chosen policy — `ema` (default: what the run evaluated; θ when it kept no EMA), `theta` or `old` (the
sampling policy) — into the base model's transformer, and writes the base folder's other components
beside it: `DiffusionPipeline.from_pretrained(DIR)` loads the result. The embedded model fits no diffusers
pipeline class (one text encoder, no VAE: it works in pixel space), so its export carries its own,
`pipeline.py`, and loads with `DiffusionPipeline.from_pretrained(DIR, trust_remote_code=True)`.

`DIR` must be new, an empty folder, or a previous export (it holds `solrl_export.json`, which records the
run, checkpoint and policy), which is replaced; it may not be inside the run directory, nor be, hold or lie
inside the base model's folder. Each is refused with one line (exit code 2) before anything loads. The
folder is written as `DIR.tmp-<pid>` beside it and renamed into place at the end: a failed write (a full
disk) removes it and leaves `DIR` as it was.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch
from safetensors import SafetensorError

from cluster.config.loading import ConfigError, load_config, one_line
from cluster.config.preflight import check_model
from diffusion.loading import load_policy
from diffusion.noise import lora_init_seed
from learner.checkpoint import CorruptCheckpoint, previous_checkpoint
from learner.checkpoint_load import load_checkpoint
from learner.export import EXPORT_RECORD, export_pipeline, merged_weights, replaceable, save_transformer
from learner.training_state import TrainingState


class ExportFailed(RuntimeError):
    """Writing the export failed; nothing of it was left behind."""


def check_out(out: Path, run_dir: Path, model_folder: Path) -> None:
    """Raise ConfigError (one line, naming the fix) unless `out` may receive the export."""
    target, run, model = out.resolve(), run_dir.resolve(), model_folder.resolve()
    if target == run or run in target.parents:
        raise ConfigError(f"--out {out} is {'' if target == run else 'inside '}the run directory {run_dir}: an "
                          f"export never writes into a run; choose a folder outside it, e.g. --out "
                          f"{run.parent / (run.name + '-pipeline')}")
    if target == model or model in target.parents or target in model.parents:
        where = "is" if target == model else "is inside" if model in target.parents else "contains"
        raise ConfigError(f"--out {out} {where} the base model's folder {model_folder}, which the export copies "
                          "from; choose a folder outside it")
    if target in run.parents:
        raise ConfigError(f"--out {out} contains the run directory {run_dir}; choose a folder outside it")
    existing = next(p for p in (target, *target.parents) if p.exists())
    if existing != target and not existing.is_dir():
        raise ConfigError(f"--out {out}: {existing} is a file, not a folder; choose another --out")
    if target.is_file():
        raise ConfigError(f"--out {out} is a file; choose a folder (new, empty, or a previous export)")
    if not replaceable(target):
        raise ConfigError(f"--out {out} holds files and is not a previous export (no {EXPORT_RECORD}), so the "
                          "export will not replace it; choose a new or empty folder")


def reason(exc: BaseException) -> str:
    """Why a write failed, in one line. `shutil.copytree` raises one `shutil.Error` for all the files it
    could not copy, whose argument is a list of (source, target, why): its str() is that list's repr."""
    if isinstance(exc, shutil.Error) and exc.args and isinstance(exc.args[0], list) and exc.args[0]:
        failures = exc.args[0]
        first = failures[0]  # its `why` is the OSError's text, which names both files
        text = f"copying: {first[2]}" if isinstance(first, tuple) and len(first) == 3 else str(first)
        return one_line(text + (f" (and {len(failures) - 1} more files)" if len(failures) > 1 else ""))
    return one_line(str(exc) or type(exc).__name__)


def export(run_dir: Path, out: Path, policy: str = "ema", checkpoint: str = "latest") -> Path:
    """The pipeline folder `out` of the run in `run_dir` (see the module docstring)."""
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"--run-dir {run_dir}: no config.yaml there (not a run directory of this tool, or its first "
                          "iteration never started)")
    config, _ = check_model(load_config(run_dir / "config.yaml"))  # a hub id: its snapshot in the local cache
    check_out(out, run_dir, config.model.folder())
    folder = run_dir / "checkpoint"
    if checkpoint == "previous":
        folder = previous_checkpoint(folder)
    # On the CPU, in the run's dtype (auto: float32), so the merge is the learner's own arithmetic.
    dtype = torch.float32 if config.model.dtype == "auto" else getattr(torch, config.model.dtype)
    base = load_policy(config.model.folder(), dtype=dtype, resolution=config.model.resolution,
                       guidance=config.model.guidance)
    state = TrainingState.from_policy(base, config.training, seed=lora_init_seed(config.run.seed))
    meta = load_checkpoint(folder, state)
    weights = merged_weights(state, policy)
    record = {"run_dir": str(run_dir.resolve()), "checkpoint": str(folder.resolve()),
              "iteration": meta["iteration"], "policy": policy, "base_model": str(config.model.folder().resolve())}
    try:
        return export_pipeline(config.model.folder(), out, lambda target: save_transformer(state, weights, target),
                               record)
    except (OSError, SafetensorError) as exc:  # a full disk, a file size limit, a permission: nothing was left
        raise ExportFailed(f"writing the export to {out} failed: {reason(exc)}; nothing was left there (a previous "
                           "export stays as it was): free space there or choose another --out") from None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m cluster.export", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", type=Path, required=True, help="the run to export (its checkpoint and config)")
    parser.add_argument("--out", type=Path, required=True, help="the pipeline folder to write (not inside the run)")
    parser.add_argument("--policy", choices=("ema", "theta", "old"), default="ema",
                        help="which weights: θ's EMA (what evaluation saw), θ, or the sampling policy θ_old")
    parser.add_argument("--checkpoint", choices=("latest", "previous"), default="latest",
                        help="the checkpoint to export (the last two are kept)")
    args = parser.parse_args(argv)
    try:
        out = export(args.run_dir, args.out, args.policy, args.checkpoint)
    except (ConfigError, CorruptCheckpoint, ExportFailed, OSError, ValueError) as exc:
        print(f"error: {reason(exc)}", file=sys.stderr)
        raise SystemExit(2) from None
    custom = (out / "pipeline.py").is_file()  # the embedded model's own pipeline class
    load = f"DiffusionPipeline.from_pretrained({str(out)!r}{', trust_remote_code=True' if custom else ''})"
    print(f"wrote the {args.policy} policy of {args.run_dir} as a pipeline folder: {out} (load it with {load})")


if __name__ == "__main__":
    main()
