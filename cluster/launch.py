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
config.yaml (a fresh run's before Ray starts; a resume's once it has started, so a failed resume never
changes it) and launches.jsonl (every start and resume with its overrides), metrics.jsonl, checkpoints
(the last two), the final weights in final/ (a diffusers transformer folder, its LoRA), a sample grid
and a reward curve (PNG), and summary.json.

Operating it: one job per run directory (`cluster.runtime.run_lock`: a second launcher is refused, naming the
holder); a run that ended before its first checkpoint starts again from iteration 0 on `--resume`; every
way a job can end but success — a failed actor or write, Ctrl-C, SIGTERM — ends with a line saying where
the run stopped and the command that continues it (exit 1, or 128 + the signal).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from actors.identity import job_name, run_label
from cluster.check import format_rows, run_checks
from cluster.config.hub_sources import Source
from cluster.config.loading import ConfigError, add_config_arguments, load_config, one_line
from cluster.config.preflight import Checked, check_inputs
from cluster.config.schema import SolRLConfig
from cluster.reports.summary import finish, print_summary
from cluster.runtime import run_lock
from cluster.runtime.local_ray import LocalRay, reap_orphans
from cluster.runtime.run_lock import RunLocked
from learner.checkpoint import CHECKPOINT_DIR, checkpoint_iteration, has_checkpoint

# Ray sets this in the entrypoint of `ray job submit`, whose current directory is a temporary copy.
IN_RAY_JOB = "RAY_JOB_CONFIG_JSON_ENV_VAR"
MIN_FREE_BYTES = 64 * 2**20  # below this a run cannot write its first checkpoint; checked before Ray starts


@dataclass
class Plan:
    """What to run, decided before Ray starts."""

    config: SolRLConfig  # as given (presets and --set): what config.yaml keeps, hub ids included
    checked: Checked  # the preflight's pass: the config the actors get (hub ids resolved), their sources
    run_dir: Path
    resume: bool | str = False  # False; or the checkpoint folder to continue from
    notes: list[str] = field(default_factory=list)
    complete: bool = False  # a finished run: nothing to do
    restart: bool = False  # a run that never reached a checkpoint: --resume starts it again from iteration 0


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


def _learner_count_note(meta: dict, config: SolRLConfig, overrides: list[str]) -> str | None:
    """A resume with another learner-group size L: refused unless asked for with --set, then said plainly.
    The micro-batch partition changes with L, so the continuation is not the run either L would have made."""
    saved, now = meta.get("extra", {}).get("learners"), config.cluster.learner.count
    if saved is None or saved == now:
        return None
    if not any(o.split("=", 1)[0].strip() == "cluster.learner.count" for o in overrides):
        raise ConfigError(f"the checkpoint was trained by {saved} learner rank(s), the config asks for {now}: a "
                          f"change of cluster.learner.count must be given with --set cluster.learner.count={now}")
    return (f"cluster.learner.count {saved} → {now}: the continuation is not the same run (each rank's micro-"
            "batches change with the group size, so the weights follow neither an undisturbed L = "
            f"{saved} nor an L = {now} run beyond float rounding per step)")


def _resume_plan(args: argparse.Namespace) -> Plan:
    from learner.checkpoint import CorruptCheckpoint, previous_checkpoint
    from learner.checkpoint_load import verify_checkpoint

    given = Path(args.resume)
    if not given.is_absolute() and os.environ.get(IN_RAY_JOB):
        raise ConfigError(f"--resume {given}: inside a Ray job give the run directory as an absolute path")
    run_dir = given.resolve()
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise ConfigError(f"--resume {given}: no config.yaml there (not a run directory of this tool); start a "
                          f"run there with --run-dir {given}")
    config = load_config(saved, args.set)
    check_run_directory(run_dir)
    folder = run_dir / CHECKPOINT_DIR
    if args.checkpoint == "previous":
        folder = previous_checkpoint(folder)
        if not has_checkpoint(folder):
            raise ConfigError(f"--resume {given} --checkpoint previous: there is no {folder.name}/ (a run keeps the "
                              "one before the last once it has written two); resume without --checkpoint")
    if not has_checkpoint(folder):  # it died before its first checkpoint: start it again, history kept
        checked = check_inputs(config)
        plan = Plan(config, checked, run_dir, notes=list(checked.notes), restart=True)
        plan.notes.append(f"{run_dir} has no checkpoint yet (its last start ended before the first one): starting "
                          "it again from iteration 0; launches.jsonl keeps the earlier attempts")
        return plan
    try:
        meta = verify_checkpoint(folder)
    except CorruptCheckpoint as exc:
        hint = "" if args.checkpoint == "previous" else f" (to use the previous one: --resume {given} " \
                                                        "--checkpoint previous)"
        raise ConfigError(f"{exc}{hint}") from None
    except FileNotFoundError as exc:
        raise ConfigError(f"--resume {given}: {exc}") from None
    checked = check_inputs(config)
    plan = Plan(config, checked, run_dir, resume=str(folder), notes=list(checked.notes))
    note = _learner_count_note(meta, config, args.set)
    if note is not None:
        plan.notes.append(note)
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
    checked = check_inputs(config)
    run_dir = run_directory(args.run_dir, config)
    check_run_directory(run_dir)
    if holds_a_run(run_dir):
        raise ConfigError(f"--run-dir {run_dir} already holds a run: continue it with --resume {run_dir} "
                          "or choose another directory")
    return Plan(config, checked, run_dir, notes=list(checked.notes))


def holds_a_run(run_dir: Path) -> bool:
    return (run_dir / "metrics.jsonl").exists() or (run_dir / "config.yaml").exists()


def check_run_directory(run_dir: Path) -> None:
    """What would fail on the run directory's first write, found before Ray starts: a file in its place,
    a folder that cannot be written (a read-only file system; permissions), a disk with no room left."""
    existing = next((p for p in (run_dir, *run_dir.parents) if p.exists()), None)
    if existing is None:
        raise ConfigError(f"run directory {run_dir}: no parent folder of it exists")
    if not existing.is_dir():
        raise ConfigError(f"run directory {run_dir}: {existing} is a file, not a folder; choose another --run-dir "
                          "(or move the file away)")
    try:  # a probe, not os.access: root passes access() on a read-only file system
        fd, probe = tempfile.mkstemp(prefix=".solrl-write-probe-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f"run directory {run_dir}: cannot write in {existing} ({exc.strerror}); choose a "
                          "writable --run-dir (or run.root)") from None
    free = shutil.disk_usage(existing).free
    if free < MIN_FREE_BYTES:
        raise ConfigError(f"run directory {run_dir}: its disk has {free / 2**20:.0f} MiB free, less than the "
                          f"{MIN_FREE_BYTES / 2**20:.0f} MiB a run needs to start; free some space or choose another "
                          "--run-dir")


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
    metadata = {"job_name": job_name(run_label(str(run_dir), config.run.name)), "run_name": config.run.name,
                "run_dir": str(run_dir)}
    cpus, gpus = local_resources(config)
    return LocalRay.start(run_dir, num_cpus=cpus, num_gpus=gpus, runtime_env=env, dashboard_host="127.0.0.1",
                          log_to_driver=True, job_config=JobConfig(metadata=metadata))


def local_resources(config: SolRLConfig) -> tuple[int, int]:
    """A local Ray's logical CPUs and GPUs: every bundle fits, whatever this machine has (scorers included),
    and so do the explorers `cluster.control` may add, up to `cluster.explorers.max`."""
    c = config.cluster
    extra = c.explorers.limit - c.explorers.count
    return (max(2, math.ceil(c.total("CPU") + extra * c.explorers.num_cpus)),
            math.ceil(c.total("GPU") + extra * c.explorers.num_gpus))


def show_dashboards(job) -> None:
    """Where to watch the run: the Ray dashboard's pages, and the Grafana dashboard installed beside Ray's."""
    import ray

    from cluster.monitoring.grafana import install_dashboard

    url = ray._private.worker.get_dashboard_url()
    if url:
        url = url if url.startswith("http") else f"http://{url}"
        print(f"Ray dashboard: {url}/#/jobs (this run's job), {url}/#/actors (solrl-learner-*, solrl-explorer-*; "
              f"namespace {job.namespace}), metrics ray_solrl_* with label run={job.run}")
    try:
        path = install_dashboard(ray._private.worker.global_worker.node.get_session_dir_path())
        print(f"Grafana dashboard 'Sol-RL job' (uid solrl) installed with Ray's: {path}")
    except (OSError, AttributeError) as exc:  # a read-only session folder; the JSON is also in the repository
        print(f"note: the Grafana dashboard was not installed ({exc}); import "
              "cluster/monitoring/dashboards/*.json by hand")


def config_yaml(config: SolRLConfig) -> str:
    """The resolved config as YAML: what config.yaml holds and --print-config prints."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def write_config(run_dir: Path, config: SolRLConfig) -> None:
    """The resolved config.yaml, atomically."""
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / "config.yaml.tmp"
    tmp.write_text(config_yaml(config))
    tmp.replace(run_dir / "config.yaml")


def record_launch(run_dir: Path, config: SolRLConfig, args: argparse.Namespace, iteration: int,
                  namespace: str | None = None, sources: Sequence[Source] = ()) -> None:
    """Once the run has started: the config as given, and one line of launches.jsonl (its overrides, and the
    hub repos it resolved: repo, commit and snapshot folder of each)."""
    write_config(run_dir, config)
    line = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "resume": args.resume is not None,
            "checkpoint": args.checkpoint if args.resume is not None else None, "config": args.config,
            "overrides": list(args.set), "from_iteration": iteration, "to_iteration": config.run.iterations,
            "hub_sources": [source.record() for source in sources],
            "ray_job": ray_job_id(), "ray_namespace": namespace}
    with (run_dir / "launches.jsonl").open("a") as f:
        f.write(json.dumps(line) + "\n")


def continue_command(run_dir: Path) -> str:
    return f"python -m cluster.launch --resume {run_dir}"


def where_it_stopped(run_dir: Path, iteration: int | None, total: int) -> str:
    done = checkpoint_iteration(run_dir / CHECKPOINT_DIR)
    at = "before training began" if iteration is None else f"at iteration {iteration} of {total}"
    since = "from iteration 0 (no checkpoint yet)" if done is None else f"from the checkpoint of iteration {done}"
    return f"{at}; continue {since} with: {continue_command(run_dir)}"


class Interrupted(SystemExit):
    """Ctrl-C or SIGTERM: unwinds through `finally`, which shuts the local Ray down."""


@dataclass
class Signals:
    """The launcher's SIGINT/SIGTERM handling: the first signal interrupts the run (exit 128 + signal); any
    later one, while the launcher stops its local Ray, is acknowledged and lets that finish."""

    received: int | None = None

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self.handle)
        signal.signal(signal.SIGINT, self.handle)

    def handle(self, signum: int, _frame) -> None:
        if self.received is not None:
            print(f"{signal.Signals(signum).name} again: still stopping the local Ray, a moment", file=sys.stderr)
            return
        self.received = signum
        raise Interrupted(128 + signum)


def print_config(args: argparse.Namespace) -> int:
    """The resolved config as the run would save it (config.yaml): the preset (or, with --resume, the run's
    own config.yaml) with every --set applied."""
    source = Path(args.resume) / "config.yaml" if args.resume is not None else args.config
    try:
        config = load_config(source, args.set)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(config_yaml(config), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster.launch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser)
    parser.add_argument("--run-dir", default=None, help="absolute, or relative to run.root / the current directory")
    parser.add_argument("--resume", default=None, metavar="DIR", help="continue the run in DIR")
    parser.add_argument("--checkpoint", choices=("latest", "previous"), default="latest",
                        help="with --resume: the checkpoint to continue from (the last two are kept)")
    parser.add_argument("--keep-ray-logs", action="store_true", help="keep a local Ray's folder after a clean run")
    parser.add_argument("--print-config", action="store_true",
                        help="print the config after the preset and --set (YAML) and exit; nothing is checked or run")
    args = parser.parse_args(argv)
    if args.print_config:
        return print_config(args)
    try:
        plan = resolve(args)  # every user error surfaces here, before Ray starts and before any file is written
    except ConfigError as exc:
        _reap(Path(args.resume or args.run_dir or "runs/x").resolve())
        print(f"error: {exc}", file=sys.stderr)
        return 2
    _reap(plan.run_dir)
    for note in plan.notes:
        print(f"note: {note}")
    if plan.complete:
        return 0
    try:  # a running job's directory is refused before the preflight's seconds (the lock is taken after it)
        run_lock.refuse_if_held(plan.run_dir)
    except RunLocked as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # the preflight of `python -m cluster.check` (backend, layer plan, memory); resolve checked the inputs
    rows = run_checks(plan.checked.config, inputs_checked=True)
    print(format_rows(rows))
    if any(row.ok is False for row in rows):  # a row not evaluated fails too: what it needs is broken
        print("error: a check failed (above); nothing was started", file=sys.stderr)
        return 2
    try:
        lock = run_lock.acquire(plan.run_dir, ray_job_id())
    except RunLocked as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        if not plan.resume and not plan.restart and holds_a_run(plan.run_dir):  # started while we checked
            print(f"error: --run-dir {plan.run_dir} already holds a run: continue it with --resume {plan.run_dir}",
                  file=sys.stderr)
            return 2
        return _run(args, plan)
    finally:
        lock.release()


def _reap(run_dir: Path) -> None:
    for note in reap_orphans(run_dir):
        print(f"note: {note}")


def _run(args: argparse.Namespace, plan: Plan) -> int:
    """The job, under the run directory's lock: every way it can end prints how to continue."""
    from cluster.runtime import driver
    from cluster.runtime.learner_group import JobFailed

    config, run_dir = plan.checked.config, plan.run_dir  # config: hub ids resolved to local folders
    # plan.restart: what an attempt that never reached a checkpoint logged is redone (the run log starts
    # again at iteration 0)
    if not plan.resume:  # at once, so a start that dies before training can be resumed (it restarts)
        write_config(run_dir, plan.config)
    print(f"run directory: {run_dir}  ({config.cluster.explorers.count} explorer(s), {config.cluster.mode} mode)")
    signals, local, clean = Signals(), None, False
    position: dict[str, int | None] = {"iteration": None}
    signals.install()

    def started(job, status: dict) -> None:
        position["iteration"] = status["iteration"]
        record_launch(run_dir, plan.config, args, status["iteration"], job.namespace, plan.checked.sources)
        if local is not None:
            local.record()  # now with the actors' processes
        show_dashboards(job)

    def advanced(_job, row: dict) -> None:
        position["iteration"] = row["iteration"] + 1

    try:
        local = connect(config, run_dir)
        signals.install()  # again after ray.init, whose native handler would end the process without unwinding
        job, _ = driver.run(config, str(run_dir), resume=plan.resume, evaluate_base=True, on_start=started,
                            on_iteration=advanced)
        summary = finish(config, run_dir, job, job.log.history, ray_job_id())
        driver.stop(job)
        print_summary(summary)
        clean = True
        return 0
    except (Interrupted, KeyboardInterrupt) as exc:
        signum = signals.received or signal.SIGINT  # KeyboardInterrupt: Ctrl-C before our handler was in place
        signals.received = signum
        print(f"interrupted by {signal.Signals(signum).name} "
              f"{where_it_stopped(run_dir, position['iteration'], config.run.iterations)}", file=sys.stderr)
        return exc.code if isinstance(exc, Interrupted) else 128 + signum
    except JobFailed as exc:
        print(f"error: {exc}. Fix the cause; the run stopped "
              f"{where_it_stopped(run_dir, position['iteration'], config.run.iterations)}", file=sys.stderr)
        return 1
    except Exception as exc:  # an actor died, a write failed, …: the details above, how to go on last
        traceback.print_exc()
        print(f"error: {type(exc).__name__}: {one_line(str(exc).strip().splitlines()[0] if str(exc).strip() else '')}"
              f" — the run stopped {where_it_stopped(run_dir, position['iteration'], config.run.iterations)}",
              file=sys.stderr)
        return 1
    finally:
        signals.received = signals.received or signal.SIGINT  # from here on a signal only acknowledges
        if local is not None:
            local.stop(remove=clean and not args.keep_ray_logs)
            if not clean or args.keep_ray_logs:
                print(f"local Ray's logs: {local.folder}/session_latest/logs (remove {local.folder} when done)",
                      file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
