"""Export a run as a diffusers pipeline folder.

    python -m cluster.export --run-dir D --out DIR [--policy theta|ema|old] [--checkpoint latest|previous]

Reads the run's `config.yaml` and its verified checkpoint (nothing in the run directory changes), merges
the chosen policy — `ema` (default: what the run evaluated; θ when it kept no EMA), `theta` or `old` (the
sampling policy) — into the base model's transformer, and writes the base folder's other components
beside it: `DiffusionPipeline.from_pretrained(DIR)` loads the result.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

from cluster.config import ConfigError, load_config, one_line
from diffusion.loading import load_policy
from diffusion.noise import lora_init_seed
from learner.checkpoint import CorruptCheckpoint, load_checkpoint, previous_checkpoint
from learner.export import export_pipeline, merged_weights, save_transformer
from learner.training_state import TrainingState


def export(run_dir: Path, out: Path, policy: str = "ema", checkpoint: str = "latest") -> Path:
    """The pipeline folder `out` of the run in `run_dir` (see the module docstring)."""
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"--run-dir {run_dir}: no config.yaml there (not a run directory of this tool, or its first "
                          "iteration never started)")
    config = load_config(run_dir / "config.yaml")
    folder = run_dir / "checkpoint"
    if checkpoint == "previous":
        folder = previous_checkpoint(folder)
    # On the CPU, in the run's dtype (auto: float32), so the merge is the learner's own arithmetic.
    dtype = torch.float32 if config.model.dtype == "auto" else getattr(torch, config.model.dtype)
    base = load_policy(config.model.folder(), dtype=dtype, resolution=config.model.resolution,
                       guidance=config.model.guidance)
    state = TrainingState.from_policy(base, config.training, seed=lora_init_seed(config.run.seed))
    load_checkpoint(folder, state)
    with tempfile.TemporaryDirectory() as tmp:
        transformer = save_transformer(state, merged_weights(state, policy), Path(tmp) / "transformer")
        return export_pipeline(config.model.folder(), transformer, out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--policy", choices=("ema", "theta", "old"), default="ema")
    parser.add_argument("--checkpoint", choices=("latest", "previous"), default="latest")
    args = parser.parse_args(argv)
    try:
        out = export(args.run_dir, args.out, args.policy, args.checkpoint)
    except (ConfigError, CorruptCheckpoint, OSError, ValueError) as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"wrote the {args.policy} policy of {args.run_dir} as a pipeline folder: {out}")


if __name__ == "__main__":
    main()
