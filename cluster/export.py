"""Export a run as a diffusers pipeline folder, with a model card, ready to share.

    python -m cluster.export --run-dir D --out DIR [--policy theta|ema|old] [--checkpoint latest|previous|N]
                             [--push-to-hub org/name [--private]]

Reads the run's `config.yaml` and its verified checkpoint (nothing in the run directory changes), merges
the chosen policy — `ema` (default: what the run evaluated; θ when it kept no EMA), `theta` or `old` (the
sampling policy) — into the base model's transformer, and writes beside it the base folder's other files that
the pipeline loads, and only those (`diffusion.loading.pipeline_files`: a hub snapshot's single-file
checkpoints stay behind): `DiffusionPipeline.from_pretrained(DIR)` loads the result. The embedded model fits no
diffusers pipeline class (one text encoder, no VAE: it works in pixel space), so its export carries its own,
`pipeline.py`, and loads with `DiffusionPipeline.from_pretrained(DIR, trust_remote_code=True)`.

Besides the pipeline: README.md, a model card the hub reads (`cluster.reports.model_card`: base model, licence
inherited from the base's card, tags, the algorithm, reward(s), iterations, held-out metrics before and after,
the sample grid, the launch commands), the run's `samples.png`, and `solrl_export.json` (run, checkpoint,
policy; left out of an upload, it names this machine's paths). `--checkpoint N` exports the checkpoint of
iteration N (`run.keep_every` keeps them). `--push-to-hub` uploads the folder through huggingface_hub.

`DIR` must be new, an empty folder, or a previous export (it holds `solrl_export.json`), which is replaced; it
may not be inside the run directory, nor be, hold or lie inside the base model's folder. Each is refused with
one line (exit code 2) before anything loads. The folder is written as `DIR.tmp-<pid>` beside it and renamed
into place at the end: a failed write (a full disk) removes it and leaves `DIR` as it was.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors import SafetensorError

from cluster.config.loading import ConfigError, load_config, one_line
from cluster.config.preflight import check_model
from cluster.config.schema import SolRLConfig
from cluster.reports.model_card import CARD_FILE as MODEL_CARD
from cluster.reports.model_card import SAMPLES_FILE, RunFacts, model_card
from diffusion.hub import hub_ref, offline
from diffusion.loading import load_policy
from diffusion.noise import lora_init_seed
from learner.checkpoint import CorruptCheckpoint
from learner.checkpoint_load import load_checkpoint
from learner.export import EXPORT_RECORD, export_pipeline, merged_weights, replaceable, save_transformer
from learner.kept_checkpoints import named_checkpoint
from learner.run_log import read_base_evaluation
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
    """Why a write failed, in one line."""
    return one_line(str(exc) or type(exc).__name__)


def run_facts(run_dir: Path, given: SolRLConfig, config: SolRLConfig, source, iteration: int, policy: str,
              out: Path) -> RunFacts:
    """What the model card says, from the run directory: the base (its hub id and commit when it came from the
    hub), the held-out evaluation of the base and the last one before the exported checkpoint, the launches."""
    before = {k: v for k, v in read_base_evaluation(run_dir).items() if k.startswith("eval_")}
    evals = [row for row in read_jsonl(run_dir / "metrics.jsonl")
             if "eval_reward" in row and row["iteration"] < iteration]
    last = evals[-1] if evals else {}
    after = {k: float(v) for k, v in last.items() if k.startswith("eval_") and isinstance(v, int | float)
             and (k in before or not before)}
    commands = []
    for launch in read_jsonl(run_dir / "launches.jsonl"):
        sets = [word for item in launch.get("overrides", []) for word in ("--set", item)]
        start = ["--resume", f"runs/{run_dir.name}"] if launch.get("resume") else \
            ["--config", str(launch.get("config")), "--run-dir", f"runs/{run_dir.name}"]
        commands.append(["python", "-m", "cluster.launch", *start, *sets])
    card = config.model.folder() / MODEL_CARD
    return RunFacts(given, iteration, policy, source.ref.repo if source else None,
                    source.folder.name if source else None, card if card.is_file() else None, before, after,
                    last.get("iteration"), commands, (run_dir / SAMPLES_FILE).is_file())


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def export(run_dir: Path, out: Path, policy: str = "ema", checkpoint: str = "latest") -> Path:
    """The pipeline folder `out` of the run in `run_dir` (see the module docstring)."""
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"--run-dir {run_dir}: no config.yaml there (not a run directory of this tool, or its first "
                          "iteration never started)")
    given = load_config(run_dir / "config.yaml")
    config, source = check_model(given)  # a hub id: its snapshot in the local cache
    check_out(out, run_dir, config.model.folder())
    try:
        folder = named_checkpoint(run_dir, checkpoint)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    # On the CPU, in the run's dtype (auto: float32), so the merge is the learner's own arithmetic.
    dtype = torch.float32 if config.model.dtype == "auto" else getattr(torch, config.model.dtype)
    base = load_policy(config.model.folder(), dtype=dtype, resolution=config.model.resolution,
                       guidance=config.model.guidance)
    state = TrainingState.from_policy(base, config.training, seed=lora_init_seed(config.run.seed))
    meta = load_checkpoint(folder, state)
    weights = merged_weights(state, policy)
    facts = run_facts(run_dir, given, config, source, int(meta["iteration"]), policy, out)
    record = {"run_dir": str(run_dir.resolve()), "checkpoint": str(folder.resolve()),
              "iteration": meta["iteration"], "policy": policy, "base_model": facts.base_model or
              str(config.model.folder().resolve()), "base_commit": facts.base_commit}
    documents: dict[str, str | Path] = {MODEL_CARD: model_card(facts)}
    if facts.has_samples:
        documents[SAMPLES_FILE] = run_dir / SAMPLES_FILE
    try:
        return export_pipeline(config.model.folder(), out, lambda target: save_transformer(state, weights, target),
                               record, documents)
    except (OSError, SafetensorError) as exc:  # a full disk, a file size limit, a permission: nothing was left
        raise ExportFailed(f"writing the export to {out} failed: {reason(exc)}; nothing was left there (a previous "
                           "export stays as it was): free space there or choose another --out") from None


def push_to_hub(out: Path, repo: str, *, private: bool = False, api=None) -> str:
    """Upload the export in `out` to the hub model repo `repo` (created when missing), all but EXPORT_RECORD
    (it names this machine's paths); the commit's URL. `api`: a `huggingface_hub.HfApi` (a token from
    `hf auth login` or HF_TOKEN)."""
    from huggingface_hub import HfApi

    api = api or HfApi()
    api.create_repo(repo, repo_type="model", private=private, exist_ok=True)
    record = json.loads((out / EXPORT_RECORD).read_text())
    commit = api.upload_folder(repo_id=repo, repo_type="model", folder_path=str(out), ignore_patterns=[EXPORT_RECORD],
                               commit_message=f"Sol-RL export: the {record['policy']} policy after "
                                              f"{record['iteration']} iterations")
    return str(getattr(commit, "commit_url", commit))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m cluster.export", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", type=Path, required=True, help="the run to export (its checkpoint and config)")
    parser.add_argument("--out", type=Path, required=True, help="the pipeline folder to write (not inside the run)")
    parser.add_argument("--policy", choices=("ema", "theta", "old"), default="ema",
                        help="which weights: θ's EMA (what evaluation saw), θ, or the sampling policy θ_old")
    parser.add_argument("--checkpoint", default="latest", metavar="latest|previous|N",
                        help="the checkpoint to export: the last two are kept, and every run.keep_every-th by its "
                             "iteration N")
    parser.add_argument("--push-to-hub", default=None, metavar="REPO",
                        help="then upload the folder to this hub model repo (org/name; created when missing; "
                             "needs `hf auth login` or HF_TOKEN, and HF_HUB_OFFLINE unset)")
    parser.add_argument("--private", action="store_true", help="with --push-to-hub: create the repo private")
    args = parser.parse_args(argv)
    try:
        if args.push_to_hub and offline():  # before the export's minutes, not after
            raise ConfigError(f"--push-to-hub {args.push_to_hub}: HF_HUB_OFFLINE=1 forbids uploading; unset it, or "
                              "export now and push later with the hub's `hf upload REPO FOLDER`")
        if args.push_to_hub and hub_ref(args.push_to_hub) is None:
            raise ConfigError(f"--push-to-hub {args.push_to_hub}: not a repo id; give org/name")
        out = export(args.run_dir, args.out, args.policy, args.checkpoint)
    except (ConfigError, CorruptCheckpoint, ExportFailed, OSError, ValueError) as exc:
        print(f"error: {reason(exc)}", file=sys.stderr)
        raise SystemExit(2) from None
    custom = (out / "pipeline.py").is_file()  # the embedded model's own pipeline class
    load = f"DiffusionPipeline.from_pretrained({str(out)!r}{', trust_remote_code=True' if custom else ''})"
    print(f"wrote the {args.policy} policy of {args.run_dir} as a pipeline folder: {out} (load it with {load}; its "
          f"model card: {out / MODEL_CARD})")
    if args.push_to_hub:
        commit = push_to_hub(out, args.push_to_hub, private=args.private)
        print(f"pushed to https://huggingface.co/{args.push_to_hub}: {commit}")


if __name__ == "__main__":
    main()
