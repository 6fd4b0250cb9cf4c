"""Run a Sol-RL job on Ray: locally, or on a cluster through `ray job submit`.

    python -m cluster.launch --config configs/embedded.yaml [--set key.path=value ...] [--run-dir DIR]
    python -m cluster.launch --resume DIR [--set run.iterations=40]
    ray job submit --working-dir . --runtime-env cluster/runtime_env.yaml -- python -m cluster.launch ...

With RAY_ADDRESS set (as `ray job submit` does) or `cluster.address`, it joins that cluster; otherwise
it starts a local Ray whose logical GPUs stand in for missing ones. The configuration is validated
before Ray starts. The run directory gets the resolved config, metrics.jsonl, checkpoints, the final
weights in final/ (safetensors), a sample grid and a reward curve (PNG), and summary.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import yaml

from cluster.config import ConfigError, SolRLConfig, apply_override, load_config, parse_config

SEEDS_PER_PROMPT = 6


def resolve(args: argparse.Namespace) -> tuple[SolRLConfig, Path, bool]:
    """The config (a resumed run's own, plus overrides), its run directory, and whether to resume."""
    if args.resume is not None:
        run_dir = Path(args.resume)
        saved = run_dir / "config.yaml"
        if not saved.is_file():
            raise ConfigError(f"--resume {run_dir}: no config.yaml there (not a run directory of this tool)")
        if not (run_dir / "checkpoint" / "meta.json").is_file():
            raise ConfigError(f"--resume {run_dir}: no checkpoint to resume from yet")
        tree = yaml.safe_load(saved.read_text()) or {}
        for override in args.set:
            apply_override(tree, override)
        return parse_config(tree), run_dir, True
    config = load_config(args.config, args.set)
    if args.run_dir and (Path(args.run_dir) / "metrics.jsonl").exists():
        raise ConfigError(f"--run-dir {args.run_dir} already holds a run: continue it with --resume {args.run_dir} "
                          "or choose another directory")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = Path(args.run_dir) if args.run_dir else Path("runs") / f"{config.run.name}-{stamp}"
    return config, run_dir, False


def _merged(tree: dict, overrides: list[str]) -> dict:
    from cluster.config import _apply_override

    for override in overrides:
        _apply_override(tree, override)
    return tree


def connect(config: SolRLConfig) -> bool:
    """Join the cluster named by the config or RAY_ADDRESS, else start a local one. True if started here."""
    import ray

    address = config.cluster.address or os.environ.get("RAY_ADDRESS")
    env = {"env_vars": {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}}
    if address:  # a job's runtime env (cluster/runtime_env.yaml) already applies; Ray refuses a second one
        ray.init(address=address, log_to_driver=True)
        return False
    c = config.cluster
    gpus = c.learner.num_gpus + c.explorers.num_gpus * c.explorers.count
    cpus = c.learner.num_cpus + c.explorers.num_cpus * c.explorers.count
    ray.init(num_cpus=max(2, int(cpus + 0.999)), num_gpus=int(gpus + 0.999), runtime_env=env,
             dashboard_host="127.0.0.1", log_to_driver=True)
    return True


def finish(config: SolRLConfig, run_dir: Path, job, history: list[dict]) -> dict:
    """Final weights, pictures and the summary."""
    import ray

    from cluster.figures import save_image_grid, save_reward_curve

    files = ray.get(job.learner.save_final.remote(str(run_dir / "final")))
    images = ray.get(job.learner.sample_images.remote(SEEDS_PER_PROMPT))
    save_image_grid(images, rows=images.shape[0] // SEEDS_PER_PROMPT, path=run_dir / "samples.png")
    full = ray.get(job.learner.history.remote()) or history
    base = ray.get(job.learner.base_evaluation.remote())
    evals = [m for m in full if "eval_reward" in m]
    summary = {"iterations": len(full), "final": files, "base_eval": base,
               "last_eval": {k: evals[-1].get(k) for k in ("eval_reward", "eval_accuracy")} if evals else {},
               "mean_iteration_s": sum(m["iteration_s"] for m in full) / max(len(full), 1)}
    if full:
        save_reward_curve(full, run_dir / "reward_curve.png", base=base or None)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/embedded.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--run-dir", default=None)
    parser.add_argument("--resume", default=None, metavar="DIR")
    args = parser.parse_args(argv)
    try:
        config, run_dir, resume = resolve(args)  # every config error surfaces here, before Ray starts
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))

    import ray

    from cluster import driver

    started = connect(config)
    try:
        print(f"run directory: {run_dir}  ({config.cluster.explorers.count} explorer(s), {config.cluster.mode} mode)")
        job, history = driver.run(config, str(run_dir), resume=resume, evaluate_base=True)
        summary = finish(config, run_dir, job, history)
        print(json.dumps(summary, indent=2))
        base, last = summary["base_eval"], summary["last_eval"]
        if base and last:
            print(f"held-out reward {base['eval_reward']:.3f} → {last['eval_reward']:.3f}, accuracy "
                  f"{base.get('eval_accuracy', float('nan')):.3f} → {last.get('eval_accuracy', float('nan')):.3f}; "
                  f"samples: {run_dir / 'samples.png'}, curve: {run_dir / 'reward_curve.png'}")
        driver.stop(job)
    finally:
        if started:
            ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
