"""Evaluate a model on held-out prompts with the run's own protocol, and compare two side by side.

    python -m cluster.evaluate --model PATH_OR_ID [--lora DIR] [--prompts FILE] [--rewards pickscore,hpsv2]
                               [--config PRESET] [--set key=value ...] --out DIR
    python -m cluster.evaluate --compare A B [same options] --out DIR

A model is one of:
- a run directory (it holds config.yaml and checkpoint/): the checkpoint's policy as the run evaluated it — θ's
  EMA through the LoRA adapters, `--checkpoint latest|previous|N` — with the run's protocol, rewards and
  held-out prompts unless overridden; a run's `final/` names the run (final/ is that policy merged);
- anything `model.path` takes: a diffusers folder, a hub id (resolved as a launch resolves it), an export of
  this tool, `embedded`: the base model, with `--lora DIR` (a diffusers LoRA folder, `final/lora`) merged into
  its transformer at the scale its metadata gives.

The protocol is the in-loop evaluation's, by the same code (`learner.evaluation.evaluate` through the trainer's
bookkeeping): `eval.steps` of the sampler's solver and CFG, the fixed seeds of `diffusion.noise.eval_seeds`
(run seed, prompt index), `eval.prompts` × `eval.seeds_per_prompt` samples, one prompt's seeds per batch, the
learner's thread count — so the embedded model and a finished run give exactly the numbers the run logged
(base_eval.json and its last evaluation). The protocol comes from `--config` (default: the config of the
first run among the models, else configs/embedded.yaml) and `--set`; `--prompts` sets `prompts.eval_source`
(all of its prompts unless eval.prompts is set), `--rewards` the reward weights (1.0 each; options with --set
reward.options.NAME.KEY=V). Rewards are scored in this process (no scorer actors).

Writes to `--out`: results.json (every model's metrics and what was evaluated), results.md (the table, the
before/after users publish with --compare), and samples.png (the held-out grid: each prompt's row shows the
models side by side on the same seeds, within the grid's pixel budget).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from cluster.config.loading import ConfigError, load_config, one_line
from cluster.config.preflight import check_inputs
from cluster.config.schema import SolRLConfig
from cluster.reports.figures import save_image_grid
from diffusion.loading import load_policy_from_config
from diffusion.progress import Progress
from diffusion.prompts import load_prompt_set
from learner.export import pipeline_class
from learner.kept_checkpoints import named_checkpoint
from learner.trainer import Trainer

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "embedded.yaml"
GRID_SEEDS = 2  # seeds per prompt of samples.png, per model


@dataclass(frozen=True)
class Subject:
    """One model to evaluate: what the user named, and how it is loaded."""

    given: str
    run_dir: Path | None = None  # a run: its checkpoint's policy
    lora: Path | None = None


def subject(given: str, lora: str | None) -> Subject:
    path = Path(given)
    if path.name == "final" and (path.parent / "config.yaml").is_file():
        path = path.parent  # a run's final/: the run's last checkpoint, evaluated as the run did
    if (path / "config.yaml").is_file() and (path / "checkpoint").exists():
        if lora:
            raise ConfigError(f"--lora with a run ({given}): a run's own adapter is evaluated; drop --lora")
        return Subject(given, run_dir=path)
    return Subject(given, lora=Path(lora) if lora else None)


def protocol(args: argparse.Namespace, subjects: list[Subject]) -> SolRLConfig:
    """The config every model is evaluated under: --config (else the first run's own among the models, else
    configs/embedded.yaml), then --set, --prompts, --rewards."""
    runs = [s.run_dir for s in subjects if s.run_dir is not None]
    source = args.config or (runs[0] / "config.yaml" if runs else DEFAULT_CONFIG)
    sets = list(args.set)
    if args.prompts:
        sets.append(f"prompts.eval_source={args.prompts}")
        if not any(s.startswith("eval.prompts=") for s in sets):
            try:
                count = len(load_prompt_set(args.prompts, heldout=True).texts)
            except (OSError, ValueError) as exc:
                raise ConfigError(one_line(f"--prompts: {exc}")) from None
            sets.append(f"eval.prompts={count}")
    if args.rewards:
        weights = ", ".join(f"{name.strip()}: 1.0" for name in args.rewards.split(",") if name.strip())
        sets.append(f"reward.weights={{{weights}}}")
    return load_config(source, sets)


def check_subject(model: Subject, checkpoint: str) -> None:
    """What can be checked of a model before any loads: a run's checkpoint, a LoRA folder."""
    if model.run_dir is not None:
        try:
            named_checkpoint(model.run_dir, checkpoint)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if model.lora is not None and not (model.lora / "pytorch_lora_weights.safetensors").is_file():
        raise ConfigError(f"--lora {model.lora}: no pytorch_lora_weights.safetensors there; name a diffusers LoRA "
                          "folder (a run's final/lora)")


def evaluator(config: SolRLConfig, model: Subject, checkpoint: str) -> tuple[Trainer, dict]:
    """A trainer holding the model as the evaluation samples it, and what was loaded (for results.json)."""
    if model.run_dir is not None:
        folder = named_checkpoint(model.run_dir, checkpoint)  # checked before any model loaded (check_subject)
        given = load_config(model.run_dir / "config.yaml")
        # the run's model and training shape (its adapters), this protocol's evaluation
        config = config.model_copy(update={"model": given.model, "training": given.training})
        checked = check_inputs(config)
        trainer = Trainer(checked.config, remote_explorers=True)
        trainer.resume(folder)
        return trainer, {"run_dir": str(model.run_dir.resolve()), "checkpoint": str(folder.resolve()),
                         "iteration": trainer.iteration, "weights": "EMA" if config.training.ema else "theta"}
    config = config.model_copy(update={"model": config.model.model_copy(update={"path": model.given})})
    checked = check_inputs(config)
    policy = load_policy_from_config(checked.config.model)
    described = {"model": model.given, "folder": str(checked.config.model.folder())}
    if model.lora is not None:
        described["lora"], described["lora_scale"] = str(model.lora), merge_lora_folder(
            policy.transformer, checked.config.model.folder(), model.lora)
    return Trainer(checked.config, remote_explorers=True, policy=policy), described


def merge_lora_folder(transformer: torch.nn.Module, model_folder: Path, lora: Path) -> float:
    """Merge a diffusers LoRA folder into `transformer` in place, W + (α/r)·B·A (α = r without metadata, as
    diffusers assumes); the scale."""
    from diffusion.lora import merge_lora

    adapters, metadata = pipeline_class(model_folder).lora_state_dict(str(lora), return_lora_metadata=True)
    adapters = {key.removeprefix("transformer."): value for key, value in adapters.items()}
    metadata = metadata or {}
    rank, alpha = metadata.get("transformer.r"), metadata.get("transformer.lora_alpha")
    scale = float(alpha) / float(rank) if rank and alpha else 1.0
    weights = transformer.state_dict()
    layers = sorted({key.rsplit(".lora_", 1)[0] for key in adapters})
    missing = [layer for layer in layers if f"{layer}.weight" not in weights]
    if missing:
        raise ConfigError(f"--lora {lora}: adapts {missing[0]}, which this model's transformer does not have")
    on_device = {key: value.to(weights[f"{key.rsplit('.lora_', 1)[0]}.weight"].device)
                 for key, value in adapters.items()}
    merged = merge_lora(weights, on_device, scale)
    transformer.load_state_dict(merged, strict=False)
    return scale


def evaluate_one(trainer: Trainer, label: str) -> dict[str, float]:
    progress = Progress(f"{label}: prompt", len(trainer.eval_prompts))
    return trainer.evaluate(progress=lambda done: print(progress.line(done), flush=True))


def table(labels: list[str], results: list[dict[str, float]]) -> str:
    names = [name for name in results[0] if all(name in r for r in results)]
    rows = ["| metric | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    rows += [f"| `{name}` | " + " | ".join(f"{r[name]:.4f}" for r in results) + " |" for name in names]
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster.evaluate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="a run directory (or its final/), a model folder, a hub id, an export, or "
                                       "'embedded'")
    which.add_argument("--compare", nargs=2, metavar=("A", "B"), help="two models, side by side (A as the baseline)")
    parser.add_argument("--lora", default=None, metavar="DIR", help="a diffusers LoRA folder merged into --model "
                                                                    "(with --compare: into B)")
    parser.add_argument("--prompts", default=None, help="held-out prompt set (any format prompts.eval_source takes)")
    parser.add_argument("--rewards", default=None, help="comma-separated reward names, each weighted 1.0")
    parser.add_argument("--config", default=None, help="the protocol's config (default: the first run's among the "
                                                       "models, else configs/embedded.yaml)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    parser.add_argument("--checkpoint", default="latest", metavar="latest|previous|N",
                        help="a run's checkpoint to evaluate")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: the learner's, "
                                                                  "cluster.learner.threads, as the run had)")
    parser.add_argument("--out", type=Path, required=True, help="folder for results.json, results.md, samples.png")
    args = parser.parse_args(argv)
    given = args.compare or [args.model]
    threads = torch.get_num_threads()
    try:
        subjects = [subject(name, args.lora if i == len(given) - 1 else None) for i, name in enumerate(given)]
        for model in subjects:
            check_subject(model, args.checkpoint)
        config = protocol(args, subjects)
        torch.set_num_threads(args.threads or config.cluster.learner.threads)
        results, described, grids = [], [], []
        for model in subjects:
            trainer, what = evaluator(config, model, args.checkpoint)
            results.append(evaluate_one(trainer, model.given))
            described.append(what)
            grids.append(trainer.sample_images(GRID_SEEDS))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:  # an in-process caller keeps its own thread count
        torch.set_num_threads(threads)
    args.out.mkdir(parents=True, exist_ok=True)
    text = table(given, results)
    protocol_line = (f"{config.eval.prompts} prompts of {config.prompts.eval_source} × {config.eval.seeds_per_prompt} "
                     f"seeds, {config.eval.steps} steps of {config.sampler.solver}, CFG {config.sampler.cfg_scale:g}, "
                     f"run seed {config.run.seed}, rewards {', '.join(config.reward.weights)}")
    (args.out / "results.md").write_text(text + "\n" + protocol_line + "\n")
    (args.out / "results.json").write_text(json.dumps(
        {"protocol": protocol_line, "models": [{"given": g, **d, "metrics": r}
                                               for g, d, r in zip(given, described, results, strict=True)]},
        indent=2) + "\n")
    rows = grids[0].shape[0] // GRID_SEEDS
    side_by_side = torch.cat([g.view(rows, GRID_SEEDS, *g.shape[1:]) for g in grids], dim=1).flatten(0, 1)
    save_image_grid(side_by_side, rows=rows, path=args.out / "samples.png")
    print(text + protocol_line)
    print(f"wrote {args.out / 'results.md'}, results.json and samples.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
