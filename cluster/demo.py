"""What the foundation shows today: the embedded model's samples and its rank fidelity.

    python -m cluster.demo [--config configs/embedded.yaml] [--set key.path=value ...] [--run-dir DIR]

1. Samples every digit prompt with the same seeds in full precision (the learner's sampler) and in
   low precision (the explorers' engine and step count): one grid, full precision on the left.
2. Measures rank fidelity of the explore engine on 96 seeds per prompt (the paper's Table 8).
The distributed Sol-RL job replaces this demo once the learner and the Ray actors exist.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from bench.rank_fidelity import format_table, measure
from cluster.config import load_config
from cluster.figures import save_image_grid
from diffusion.embedded.data import TRAIN_TEMPLATES, prompt_for
from diffusion.explore import build_explore_engine
from diffusion.loading import load_policy_from_config
from diffusion.noise import derive_seeds
from rewards import build_reward_from_config

SEEDS_PER_DIGIT = 6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/embedded.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--run-dir", type=Path, default=Path("runs/demo"))
    parser.add_argument("--prompts", type=int, default=10, help="prompts for the rank-fidelity table")
    args = parser.parse_args(argv)
    config = load_config(args.config, args.set)  # fails here, before any model loads
    torch.set_num_threads(2)
    start = time.perf_counter()

    policy = load_policy_from_config(config.model)
    reward = build_reward_from_config(config.reward)
    engine = build_explore_engine(policy, config.explore)
    print(f"model: {config.model.folder()} ({policy.family.name}, latents {policy.latent_shape}), "
          f"explore: {config.explore.precision} × {config.explore.steps} steps, "
          f"learner: full precision × {config.sampler.steps} steps")

    prompts = [prompt_for(d, TRAIN_TEMPLATES[0]) for d in range(10) for _ in range(SEEDS_PER_DIGIT)]
    seeds = [s for d in range(10) for s in derive_seeds(config.run.seed, -1, d, SEEDS_PER_DIGIT)]
    full = policy.decode(policy.sample(prompts, seeds, steps=config.sampler.steps, solver=config.sampler.solver).x0)
    low = policy.decode(policy.sample(prompts, seeds, steps=config.explore.steps, solver=config.explore.solver,
                                      transformer=engine).x0)
    rows = torch.cat([full.view(10, SEEDS_PER_DIGIT, *full.shape[1:]), low.view(10, SEEDS_PER_DIGIT, *low.shape[1:])],
                     dim=1).flatten(0, 1)
    grid = save_image_grid(rows, rows=10, path=args.run_dir / "samples.png")
    summary = {}
    for name, images in (("full_precision", full), (config.explore.precision, low)):
        details = reward.details(images, prompts) if hasattr(reward, "details") else {}
        summary[name] = {"mean_reward": float(reward(images, prompts).mean()),
                         "accuracy": float(details["accuracy"].mean()) if "accuracy" in details else None}
        print(f"  {name:16s} mean reward {summary[name]['mean_reward']:7.3f}   accuracy {summary[name]['accuracy']}")
    print(f"sample grid (rows: digits 0-9; left {SEEDS_PER_DIGIT}: full precision, right: the same seeds in "
          f"{config.explore.precision}): {grid}")

    print(f"\nrank fidelity on {args.prompts} prompts × 96 seeds:")
    results = measure(config, policy, reward, args.prompts, 96, config.explore.steps, config.sampler.steps,
                      [config.explore.precision])
    print(format_table(results))
    summary["rank_fidelity"] = results
    summary["seconds"] = round(time.perf_counter() - start, 1)
    (args.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"\ndone in {summary['seconds']} s; summary: {args.run_dir / 'summary.json'}")


if __name__ == "__main__":
    main()
