"""The distributed job's throughput on this machine: explorers, modes, driver overhead, sync share.

    python -m bench.cluster_throughput [--iterations 4] [--only NAME ...] [--no-driver] --json FILE

1. The embedded Sol-RL job on a local Ray, run side by side: 1 explorer sync with and without streamed
   regeneration, 2 explorers sync, 1 explorer async (max lag 1), 1 explorer and a learner group of 2
   ranks (`--only` picks variants by name; their results are merged into an existing --json file).
   Per run: candidates per second (explored candidates ÷ the wall time the driver waited for them),
   learner idle fraction, the sync share of iteration time (learner's publish + explorers' fetch/load
   ÷ iteration time), seconds per iteration as the driver saw it (dispatch → finished). The first
   iteration (actor start-up, first touches) is left out.
2. Ranked-group records per second the driver sustains: explorers that answer instantly with a
   96-candidate group, so only dispatch, transport and gather are timed.
On 2 cores the learner and the explorers share the CPUs: ratios show contention, not GPU scaling.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import ray
import torch

from cluster.config.loading import load_config
from cluster.runtime import driver
from cluster.runtime.explorer_pool import ExplorerPool
from learner.rollouts import RankedGroup


class InstantExplorer:
    """Answers every slot at once with a fixed 96-candidate group (no model): driver overhead only."""

    def explore(self, iteration: int, slot: int, prompt: str, version: int) -> RankedGroup:
        return RankedGroup(iteration, slot, prompt, list(range(96)), torch.zeros(96), version)


def records_per_second(slots: int = 2000, explorers: int = 2) -> float:
    actors = [ray.remote(InstantExplorer).options(num_cpus=0).remote() for _ in range(explorers)]
    pool = ExplorerPool(actors)
    prompts = list(enumerate(["a handwritten digit one"] * 100))
    pool.collect(pool.submit(0, prompts, 0), {})  # warm-up
    start = time.perf_counter()
    done = 0
    while done < slots:
        done += len(pool.collect(pool.submit(0, prompts, 0), {}))
    rate = done / (time.perf_counter() - start)
    for actor in actors:
        ray.kill(actor)
    return rate


def job_stats(history: list[dict]) -> dict[str, float]:
    steady = history[1:] or history
    mean = lambda key: float(np.mean([m.get(key, 0.0) or 0.0 for m in steady]))  # noqa: E731
    iteration_s = mean("iteration_wall_s")
    return {"candidates_per_second": mean("candidates_per_second"),
            "learner_idle_fraction": mean("learner_idle_fraction"), "sync_s": mean("sync_s"),
            "iteration_s": iteration_s, "sync_share": mean("sync_s") / iteration_s,
            "explore_wall_s": mean("explore_wall_s"), "train_s": mean("train_s"), "regen_s": mean("rollout_s"),
            "streamed_regen_s": mean("streamed_rollout_s"), "fp_sample_steps": mean("fp_sample_steps")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/embedded.yaml")
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--only", nargs="+", default=None, help="run the variants whose name contains one of these")
    parser.add_argument("--no-driver", action="store_true", help="skip the driver's records-per-second test")
    args = parser.parse_args(argv)
    variants = {
        "1 explorer, sync, not streamed": ["cluster.explorers.count=1", "cluster.stream_regeneration=false"],
        "1 explorer, sync": ["cluster.explorers.count=1"],
        "2 explorers, sync": ["cluster.explorers.count=2"],
        "1 explorer, async (lag 1)": ["cluster.explorers.count=1", "cluster.mode=async"],
        "1 explorer, 1 learner rank": ["cluster.explorers.count=1", "cluster.learner.count=1"],
        "1 explorer, 2 learner ranks": ["cluster.explorers.count=1", "cluster.learner.count=2"],
    }
    if args.only:
        variants = {k: v for k, v in variants.items() if any(word in k for word in args.only)}
        if not variants:
            parser.error(f"--only {' '.join(args.only)} names no variant")
    common = [f"run.iterations={args.iterations}", "eval.every=0", "run.checkpoint_every=0",
              "cluster.explorers.num_cpus=0.5", "cluster.learner.num_cpus=0.5"]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    merge = args.only and args.json.is_file()
    results: dict[str, dict[str, float]] = json.loads(args.json.read_text()) if merge else {}
    for name, extra in variants.items():
        config = load_config(args.config, common + extra)
        job, history = driver.run(config, None, log=lambda line: print(f"  {line}", flush=True))
        driver.stop(job)
        results[name] = job_stats(history)
        print(f"{name}: {results[name]}", flush=True)
    if not args.no_driver:
        results["driver"] = {"records_per_second": records_per_second()}
    ray.shutdown()

    print("\n| run | candidates/s | learner idle | sync share of iteration | s / iteration |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        if name != "driver":
            print(f"| {name} | {r['candidates_per_second']:.0f} | {r['learner_idle_fraction']:.0%} | "
                  f"{r['sync_share']:.2%} | {r['iteration_s']:.1f} |")
    if "driver" in results:
        print(f"\ndriver: {results['driver']['records_per_second']:.0f} ranked-group records per second")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
