"""Sol-RL on the embedded world, in one process, with the rank-fidelity table first (`make demo-local`).

    python -m bench.demo [--config configs/embedded.yaml] [--set key.path=value ...] [--run-dir DIR]
                           [--iterations 10]

1. Rank fidelity of the explore engine (the paper's Table 8) on a few prompts × 96 seeds.
2. Sol-RL training: per iteration 8 prompts × 96 seeds explored in NVFP4 with 6 steps, the best and
   worst 12 regenerated in full precision with 10 steps, one DiffusionNFT update (LoRA), the
   sampling policy published to the engine. Held-out reward every 2 iterations.
3. In the run directory: samples_before_after.png, reward_curve.png, metrics.jsonl, summary.json.
`make demo` runs the same loop as a Ray job (explorer and learner actors): `python -m cluster.launch`.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from bench.rank_fidelity import format_table, measure
from cluster.config.loading import add_config_arguments, load_config
from cluster.reports.figures import save_image_grid, save_reward_curve
from cluster.reports.summary import before_after
from diffusion.embedded.data import TRAIN_TEMPLATES, prompt_for
from diffusion.noise import grid_seeds
from learner.rollouts import generate
from learner.run_log import write_summary
from learner.trainer import Trainer

SEEDS_PER_DIGIT = 6


def sample_digits(trainer: Trainer, seed: int) -> torch.Tensor:
    """Every digit × the same seeds, full precision, with θ as evaluated (its EMA when kept)."""
    prompts = [prompt_for(d, TRAIN_TEMPLATES[0]) for d in range(10) for _ in range(SEEDS_PER_DIGIT)]
    seeds = [s for d in range(10) for s in grid_seeds(seed, d, SEEDS_PER_DIGIT)]
    with trainer.state.evaluated() as model:
        return generate(trainer.policy, model, None, prompts, seeds, trainer.eval_sampling, return_images=True).images


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser)
    parser.add_argument("--run-dir", type=Path, default=Path("runs/demo"), help="where its files go")
    parser.add_argument("--iterations", type=int, default=10, help="training iterations")
    parser.add_argument("--fidelity-prompts", type=int, default=5, help="prompts of the rank-fidelity table")
    args = parser.parse_args(argv)
    config = load_config(args.config, [*args.set, f"run.iterations={args.iterations}"])  # fails before work
    torch.set_num_threads(2)
    start = time.perf_counter()
    args.run_dir.mkdir(parents=True, exist_ok=True)

    trainer = Trainer(config, run_dir=args.run_dir)
    precision = trainer.explore_plan.precision  # what `explore.precision` (auto: the device's choice) resolved to
    print(f"model {config.model.path} ({trainer.policy.family.name}); explore {precision} × "
          f"{config.explore.steps} steps, {config.prompts.candidates} seeds per prompt; learner full precision × "
          f"{config.sampler.steps} steps on {config.prompts.keep} kept seeds; objective {config.learner.objective}")

    print(f"\n1. rank fidelity, {args.fidelity_prompts} prompts × 96 seeds "
          f"(python -m bench.rank_fidelity for the full table):")
    fidelity = measure(config, trainer.policy, trainer.reward, args.fidelity_prompts, 96, config.explore.steps,
                       config.sampler.steps, [precision])
    print(format_table(fidelity))

    print(f"\n2. Sol-RL, {args.iterations} iterations × {config.prompts.per_iteration} prompts:")
    base = trainer.evaluate()
    print(f"base model: held-out reward {base['eval_reward']:.3f}, accuracy {base.get('eval_accuracy', 0):.3f}")
    before = sample_digits(trainer, config.run.seed)
    trainer.run(log=print)
    after = sample_digits(trainer, config.run.seed)
    final = next(m for m in reversed(trainer.history) if "eval_reward" in m)

    grid = save_image_grid(before_after(before, after, SEEDS_PER_DIGIT), rows=10,
                           path=args.run_dir / "samples_before_after.png")
    curve = save_reward_curve(trainer.history, args.run_dir / "reward_curve.png", base=base)
    summary = {
        "base": base,
        "final": {k: final[k] for k in ("eval_reward", "eval_accuracy") if k in final},
        "iterations": args.iterations,
        "seconds": round(time.perf_counter() - start, 1),
        "mean_iteration_s": sum(m["iteration_s"] for m in trainer.history) / len(trainer.history),
        "rank_fidelity": fidelity,
    }
    write_summary(args.run_dir, summary)
    print(f"\nheld-out reward {base['eval_reward']:.3f} → {final['eval_reward']:.3f}, accuracy "
          f"{base.get('eval_accuracy', 0):.3f} → {final.get('eval_accuracy', 0):.3f} in {args.iterations} iterations "
          f"({summary['seconds']} s)")
    print(f"samples (rows: digits 0-9; left: base model, right: after training, same seeds): {grid}")
    print(f"reward curve: {curve}\nmetrics: {args.run_dir / 'metrics.jsonl'}\nsummary: {args.run_dir / 'summary.json'}")


if __name__ == "__main__":
    main()
