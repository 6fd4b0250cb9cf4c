"""Run a Sol-RL job on Ray: locally, or on a cluster through `ray job submit`.

    python -m cluster.launch --config configs/embedded.yaml [--set key.path=value ...] [--run-dir DIR]
    python -m cluster.launch --resume DIR [--set run.iterations=40] [--checkpoint previous]
    ray job submit --working-dir . --runtime-env cluster/runtime_env.yaml -- python -m cluster.launch \
        --config configs/embedded.yaml --run-dir /shared/runs/exp1

With RAY_ADDRESS set (as `ray job submit` does) or `cluster.address`, it joins that cluster; otherwise
it starts a local Ray (its own temporary folder, removed after a clean run, and shut down on Ctrl-C
or SIGTERM) whose logical GPUs stand in for missing ones. Every input is checked before Ray starts:
a bad one is one line on stderr and exit code 2, and leaves no run directory. The run directory
(absolute; inside a Ray job it must be given absolute or under `run.root`) gets the resolved
config.yaml (written once the run has started) and launches.jsonl (every start and resume with its
overrides), metrics.jsonl, checkpoints (the last two), the final weights in final/ (a diffusers
transformer folder, its LoRA), a sample grid and a reward curve (PNG), and summary.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from actors.identity import job_name, run_label
from cluster.check import format_rows, run_checks
from cluster.config import ConfigError, SolRLConfig, load_config
from cluster.local_ray import LocalRay, reap_orphans
from cluster.preflight import check_inputs
from cluster.run_costs import measured_costs

SEEDS_PER_PROMPT = 6
# Ray sets this in the entrypoint of `ray job submit`, whose current directory is a temporary copy.
IN_RAY_JOB = "RAY_JOB_CONFIG_JSON_ENV_VAR"
CHECKPOINT = "checkpoint"


@dataclass
class Plan:
    """What to run, decided before Ray starts."""

    config: SolRLConfig
    run_dir: Path
    resume: bool | str = False  # False; or the checkpoint folder to continue from
    notes: list[str] = field(default_factory=list)
    complete: bool = False  # a finished run: nothing to do


def run_directory(given: str | None, config: SolRLConfig) -> Path:
    """The absolute run directory: `given` (or `<run.name>-<time>` under runs/), relative ones against
    `run.root` or the current directory — which inside a Ray job is a temporary copy, so refused."""
    root = config.run.root
    if root is not None and not Path(root).is_absolute():
        raise ConfigError(f"run.root ({root}) must be an absolute path, e.g. run.root=/shared/runs")
    path = Path(given) if given else Path(f"{config.run.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    if path.is_absolute():
        return path
    if root is not None:
        return Path(root) / path
    if os.environ.get(IN_RAY_JOB):
        raise ConfigError(
            f"run directory {str(path)!r} is relative: inside a Ray job it would land in Ray's temporary copy of the "
            "working directory and vanish with the cluster; pass an absolute path on shared storage "
            "(--run-dir /shared/runs/exp1) or set run.root=/shared/runs")
    return (Path.cwd() / (path if given else Path("runs") / path)).resolve()


def _resume_plan(args: argparse.Namespace) -> Plan:
    from learner.checkpoint import CorruptCheckpoint, previous_checkpoint, verify_checkpoint

    given = Path(args.resume)
    if not given.is_absolute() and os.environ.get(IN_RAY_JOB):
        raise ConfigError(f"--resume {given}: inside a Ray job give the run directory as an absolute path")
    run_dir = given.resolve()
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise ConfigError(f"--resume {given}: no config.yaml there (not a run directory of this tool, or its first "
                          "start failed before training began)")
    config = load_config(saved, args.set)
    folder = run_dir / CHECKPOINT
    if args.checkpoint == "previous":
        folder = previous_checkpoint(folder)
    if not folder.exists() and not folder.with_name(folder.name + ".tmp").exists():
        raise ConfigError(f"--resume {given}: no checkpoint {folder.name}/ to resume from yet")
    try:
        meta = verify_checkpoint(folder)
    except CorruptCheckpoint as exc:
        hint = "" if args.checkpoint == "previous" else f" (to use the previous one: --resume {given} " \
                                                        "--checkpoint previous)"
        raise ConfigError(f"{exc}{hint}") from None
    except FileNotFoundError as exc:
        raise ConfigError(f"--resume {given}: {exc}") from None
    plan = Plan(config, run_dir, resume=str(folder), notes=check_inputs(config))
    done = int(meta["iteration"])
    if done >= config.run.iterations and (run_dir / "summary.json").is_file():
        plan.complete = True
        plan.notes.append(f"run {run_dir} is complete ({done} of {config.run.iterations} iterations, summary.json "
                          f"written); nothing changed. To train further: --resume {given} --set run.iterations=N "
                          f"with N > {done}")
    return plan


def resolve(args: argparse.Namespace) -> Plan:
    """Everything about the run that can be checked without Ray: config, inputs, run directory, checkpoint."""
    if args.resume is not None:
        return _resume_plan(args)
    config = load_config(args.config, args.set)
    notes = check_inputs(config)
    run_dir = run_directory(args.run_dir, config)
    if (run_dir / "metrics.jsonl").exists() or (run_dir / "config.yaml").exists():
        raise ConfigError(f"--run-dir {run_dir} already holds a run: continue it with --resume {run_dir} "
                          "or choose another directory")
    return Plan(config, run_dir, notes=notes)


def ray_job_id() -> str | None:
    """The submission id of the Ray job this process is the entrypoint of (None outside `ray job submit`)."""
    try:
        return json.loads(os.environ.get(IN_RAY_JOB, "{}")).get("metadata", {}).get("job_submission_id")
    except ValueError:
        return None


def connect(config: SolRLConfig, run_dir: Path) -> LocalRay | None:
    """Join the cluster named by the config or RAY_ADDRESS, else start a local one of its own (None when
    joining). A local run's driver job carries the run's name and directory in its metadata (`ray list
    jobs --detail`); a submitted job carries whatever `ray job submit --metadata-json` gave it."""
    import ray
    from ray.job_config import JobConfig

    address = config.cluster.address or os.environ.get("RAY_ADDRESS")
    env = {"env_vars": {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}}
    if address:  # a job's runtime env (cluster/runtime_env.yaml) already applies; Ray refuses a second one
        ray.init(address=address, log_to_driver=True)
        return None
    c = config.cluster  # logical resources: every bundle fits, whatever this machine has (scorers included)
    metadata = {"job_name": job_name(run_label(str(run_dir), config.run.name)), "run_name": config.run.name,
                "run_dir": str(run_dir)}
    return LocalRay.start(num_cpus=max(2, math.ceil(c.total("CPU"))), num_gpus=math.ceil(c.total("GPU")),
                          runtime_env=env, dashboard_host="127.0.0.1", log_to_driver=True,
                          job_config=JobConfig(metadata=metadata))


def show_dashboards(job) -> None:
    """Where to watch the run: the Ray dashboard's pages, and the Grafana dashboard installed beside Ray's."""
    import ray

    from cluster.grafana import install_dashboard

    url = ray._private.worker.get_dashboard_url()
    if url:
        url = url if url.startswith("http") else f"http://{url}"
        print(f"Ray dashboard: {url}/#/jobs (this run's job), {url}/#/actors (solrl-learner-*, solrl-explorer-*; "
              f"namespace {job.namespace}), metrics ray_solrl_* with label run={job.run}")
    try:
        path = install_dashboard(ray._private.worker.global_worker.node.get_session_dir_path())
        print(f"Grafana dashboard 'Sol-RL job' (uid solrl) installed with Ray's: {path}")
    except (OSError, AttributeError) as exc:  # a read-only session folder; the JSON is also in the repository
        print(f"note: the Grafana dashboard was not installed ({exc}); import cluster/dashboards/*.json by hand")


def record_launch(run_dir: Path, config: SolRLConfig, args: argparse.Namespace, iteration: int,
                  namespace: str | None = None) -> None:
    """Once the run has started: the resolved config, and one line of launches.jsonl (its overrides)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / "config.yaml.tmp"
    tmp.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    tmp.replace(run_dir / "config.yaml")
    line = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "resume": args.resume is not None,
            "checkpoint": args.checkpoint if args.resume is not None else None, "config": args.config,
            "overrides": list(args.set), "from_iteration": iteration, "to_iteration": config.run.iterations,
            "ray_job": ray_job_id(), "ray_namespace": namespace}
    with (run_dir / "launches.jsonl").open("a") as f:
        f.write(json.dumps(line) + "\n")


def finish(config: SolRLConfig, run_dir: Path, job) -> dict:
    """Final weights, pictures and the summary of the whole run (resumed parts included)."""
    import ray

    from cluster.figures import save_image_grid, save_reward_curve

    files = ray.get(job.learner.save_final.remote(str(run_dir / "final")))
    images = ray.get(job.learner.sample_images.remote(SEEDS_PER_PROMPT))
    samples = save_image_grid(images, rows=images.shape[0] // SEEDS_PER_PROMPT, path=run_dir / "samples.png")
    full = ray.get(job.learner.history.remote())
    base = ray.get(job.learner.base_evaluation.remote())
    evals = [m for m in full if "eval_reward" in m]
    summary = {"run_dir": str(run_dir), "ray_job": ray_job_id(), "iterations": len(full), "final": files,
               "samples": str(samples), "base_eval": base,
               "last_eval": {k: evals[-1].get(k) for k in ("eval_reward", "eval_accuracy")} if evals else {},
               "mean_iteration_s": sum(m["iteration_s"] for m in full) / max(len(full), 1)}
    if full:
        summary["reward_curve"] = str(save_reward_curve(full, run_dir / "reward_curve.png", base=base or None))
    costs = measured_costs(config, full)
    if costs is not None:  # what this run measured, for python -m bench.plan --costs
        (run_dir / "costs.json").write_text(json.dumps(costs, indent=2) + "\n")
        summary["costs"] = str(run_dir / "costs.json")
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _terminate(signum: int, _frame) -> None:
    raise SystemExit(128 + signum)  # unwinds through `finally`, which shuts the local Ray down


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/embedded.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--run-dir", default=None, help="absolute, or relative to run.root / the current directory")
    parser.add_argument("--resume", default=None, metavar="DIR", help="continue the run in DIR")
    parser.add_argument("--checkpoint", choices=("latest", "previous"), default="latest",
                        help="with --resume: the checkpoint to continue from (the last two are kept)")
    parser.add_argument("--keep-ray-logs", action="store_true", help="keep a local Ray's folder after a clean run")
    args = parser.parse_args(argv)
    for note in reap_orphans():
        print(f"note: {note}")
    try:
        plan = resolve(args)  # every user error surfaces here, before Ray starts and before any file is written
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for note in plan.notes:
        print(f"note: {note}")
    if plan.complete:
        return 0
    config, run_dir = plan.config, plan.run_dir
    rows = run_checks(config)  # the preflight of `python -m cluster.check`: backend, layer plan, memory
    print(format_rows(rows))
    if any(row.ok is False for row in rows):
        print("error: a check failed (above); nothing was started", file=sys.stderr)
        return 2
    run_dir.mkdir(parents=True, exist_ok=True)

    from cluster import driver
    from cluster.learner_group import JobFailed

    print(f"run directory: {run_dir}  ({config.cluster.explorers.count} explorer(s), {config.cluster.mode} mode)")
    local, clean = connect(config, run_dir), False
    # After ray.init, whose native handler would otherwise end the process on SIGTERM without unwinding.
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, _terminate)

    def started(job, status: dict) -> None:
        record_launch(run_dir, config, args, status["iteration"], job.namespace)
        if local is not None:
            local.record()  # now with the actors' processes
        show_dashboards(job)

    try:
        job, _ = driver.run(config, str(run_dir), resume=plan.resume, evaluate_base=True, on_start=started)
        summary = finish(config, run_dir, job)
        driver.stop(job)
        print(json.dumps(summary, indent=2))
        base, last = summary["base_eval"], summary["last_eval"]
        if base and last:
            line = f"held-out reward {base['eval_reward']:.3f} → {last['eval_reward']:.3f}"
            if base.get("eval_accuracy") is not None and last.get("eval_accuracy") is not None:
                line += f", accuracy {base['eval_accuracy']:.3f} → {last['eval_accuracy']:.3f}"
            print(line)  # accuracy: only rewards that report one (the digit classifier alone)
        print(f"run directory: {run_dir}")
        clean = True
    except JobFailed as exc:
        print(f"error: {exc}. Fix the cause, then continue with: python -m cluster.launch --resume {run_dir}",
              file=sys.stderr)
        return 1
    finally:
        if local is not None:
            local.stop(remove=clean and not args.keep_ray_logs)
            if not clean or args.keep_ray_logs:
                print(f"local Ray's logs: {local.folder}/session_latest/logs (remove {local.folder} when done)",
                      file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
