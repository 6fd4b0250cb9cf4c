"""What a finished run leaves besides its checkpoints: the final weights, pictures, costs and summary.json."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from cluster.config.schema import SolRLConfig
from cluster.reports.figures import save_image_grid, save_reward_curve
from cluster.reports.run_costs import measured_costs
from learner.run_log import read_base_evaluation, write_summary

SEEDS_PER_PROMPT = 6  # the held-out grid of samples.png: each prompt's row holds these seeds twice


def before_after(base: torch.Tensor, trained: torch.Tensor, seeds: int) -> torch.Tensor:
    """Per prompt, its `seeds` base-model samples and then the trained model's of the same seeds: a grid of
    one row per prompt shows before | after (what users publish)."""
    rows = base.shape[0] // seeds
    return torch.cat([base.view(rows, seeds, *base.shape[1:]), trained.view(rows, seeds, *trained.shape[1:])],
                     dim=1).flatten(0, 1)


def finish(config: SolRLConfig, run_dir: Path, job, full: list[dict], ray_job: str | None = None) -> dict:
    """Final weights, pictures and the summary of the whole run: `full` is the driver's record of every
    iteration (resumed parts included); `ray_job`: the submission id it ran under."""
    import ray

    files = ray.get(job.learner.save_final.remote(str(run_dir / "final")))
    trained, base_images = ray.get([job.learner.sample_images.remote(SEEDS_PER_PROMPT, base)
                                    for base in (False, True)])
    samples = save_image_grid(before_after(base_images, trained, SEEDS_PER_PROMPT),
                              rows=trained.shape[0] // SEEDS_PER_PROMPT, path=run_dir / "samples.png")
    base = read_base_evaluation(run_dir)
    evals = [m for m in full if "eval_reward" in m]
    summary = {"run_dir": str(run_dir), "ray_job": ray_job, "iterations": len(full), "final": files,
               "samples": str(samples), "base_eval": base,
               "last_eval": {k: evals[-1].get(k) for k in ("eval_reward", "eval_accuracy")} if evals else {},
               "mean_iteration_s": sum(m["iteration_s"] for m in full) / max(len(full), 1)}
    if full:
        summary["reward_curve"] = str(save_reward_curve(full, run_dir / "reward_curve.png", base=base or None))
    costs = measured_costs(config, full)
    if costs is not None:  # what this run measured, for python -m bench.plan --costs
        (run_dir / "costs.json").write_text(json.dumps(costs, indent=2) + "\n")
        summary["costs"] = str(run_dir / "costs.json")
    write_summary(run_dir, summary)
    return summary


def print_summary(summary: dict) -> None:
    print(json.dumps(summary, indent=2))
    base, last = summary["base_eval"], summary["last_eval"]
    if base and last:
        line = f"held-out reward {base['eval_reward']:.3f} → {last['eval_reward']:.3f}"
        if base.get("eval_accuracy") is not None and last.get("eval_accuracy") is not None:
            line += f", accuracy {base['eval_accuracy']:.3f} → {last['eval_accuracy']:.3f}"
        print(line)  # accuracy: only rewards that report one (the digit classifier alone)
    print(f"run directory: {summary['run_dir']}")
