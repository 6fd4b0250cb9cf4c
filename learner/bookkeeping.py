"""Rank 0's bookkeeping: held-out evaluation, checkpoints and resume, the final weights.

Nothing here changes the policy: evaluation samples held-out prompts × fixed seeds with θ as evaluated
(its EMA when kept), checkpoints save and restore the `TrainingState`, and `save_final` writes what
diffusers users load (`learner.export`). The run's log is not written here (`learner.run_log.RunLog`).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from diffusion.policy import FlowPolicy
from diffusion.prompts import load_prompt_set
from learner.checkpoint import (
    CHECKPOINT_DIR,
    check_finite,
    save_checkpoint,
    write_safetensors,
    written_into,
)
from learner.checkpoint_load import load_checkpoint
from learner.config import TrainerConfig
from learner.evaluation import evaluate, grid_samples, sample_grid
from learner.experiment_log import GridSamples, enabled
from learner.export import LORA_DIR, TRANSFORMER_DIR, merged_weights, save_lora, save_transformer
from learner.kept_checkpoints import keep_checkpoint
from learner.rollouts import evaluation_sampling
from learner.training_state import TrainingState
from rewards import Reward

SAMPLING_FILE = "sampling_transformer.safetensors"  # θ_old, the policy the explorers held last


class Bookkeeping:
    def __init__(self, config: TrainerConfig, policy: FlowPolicy, state: TrainingState, reward: Reward,
                 run_dir: Path | None) -> None:
        self.config, self.policy, self.state, self.reward, self.run_dir = config, policy, state, reward, run_dir
        self.seed = config.run.seed
        self.eval_sampling = evaluation_sampling(config)
        self.eval_prompt_set = load_prompt_set(config.prompts.eval_source, heldout=True)
        self.eval_prompts = self.eval_prompt_set.texts[: config.eval.prompts]

    # ---- evaluation ------------------------------------------------------------------------------
    def evaluation_due(self, done: int) -> bool:
        """After `done` iterations: every `eval.every` and at the run's end."""
        every = self.config.eval.every
        return bool(every) and (done % every == 0 or done == self.config.run.iterations)

    def evaluate(self, progress: Callable[[int], object] | None = None) -> dict[str, float]:
        """Held-out prompts × fixed seeds, full precision, `eval.steps`, θ as evaluated (its EMA when kept);
        `progress(prompts done)` after each prompt."""
        return evaluate(self.policy, self.state, self.reward, self.eval_prompts, prompt_set=self.eval_prompt_set,
                        run_seed=self.seed, seeds_per_prompt=self.config.eval.seeds_per_prompt,
                        sampling=self.eval_sampling, progress=progress)

    def logged_grid(self) -> GridSamples | None:
        """The experiment log's held-out grid (`logging.grid_prompts` × `logging.grid_seeds`, each scored);
        None when no experiment log is configured."""
        c = self.config.logging
        if not enabled(c):
            return None
        prompts = self.eval_prompts[: c.grid_prompts]
        out = grid_samples(self.policy, self.state, prompts, run_seed=self.seed, seeds_per_prompt=c.grid_seeds,
                           sampling=self.eval_sampling, reward=self.reward, prompt_set=self.eval_prompt_set)
        return GridSamples([p for p in prompts for _ in range(c.grid_seeds)], out.images, out.rewards, c.grid_seeds)

    def sample_images(self, seeds_per_prompt: int = 6, *, base: bool = False) -> torch.Tensor:
        """Held-out prompts × fixed seeds: images [P·S, C, H, W] (`learner.evaluation.sample_grid`); `base`:
        the base model's, for the same prompts and seeds."""
        return sample_grid(self.policy, self.state, self.eval_prompts, run_seed=self.seed,
                           seeds_per_prompt=seeds_per_prompt, sampling=self.eval_sampling, base=base)

    # ---- checkpoints -----------------------------------------------------------------------------
    def checkpoint_due(self, done: int) -> bool:
        every = self.config.run.checkpoint_every
        return self.run_dir is not None and (bool(every and done % every == 0) or done == self.config.run.iterations)

    def checkpoint(self, done: int, version: int, learners: int, spread_reference: float | None = None) -> None:
        """run_dir/checkpoint after `done` iterations; `learners`: L (a resume with another L is another run);
        `spread_reference`: the spread schedule's reference for iteration `done` (JSON keeps a float exactly)."""
        folder = save_checkpoint(self.run_dir / CHECKPOINT_DIR, self.state, iteration=done,
                                 extra={"version": version, "learners": learners,
                                        "spread_reference": spread_reference})
        keep = self.config.run.keep_every
        if keep and done % keep == 0:  # a multiple of checkpoint_every (a rule): this save is the one to keep
            keep_checkpoint(folder, self.run_dir)

    def resume(self, checkpoint: str | Path | None = None) -> tuple[int, int, float | None]:
        """Restore run_dir/checkpoint (or the folder given) into the training state: bitwise the same
        continuation as not stopping (on CPU), once the caller publishes. (iteration, policy version, the
        spread schedule's reference for that iteration: None when the checkpoint has none.)"""
        folder = Path(checkpoint) if checkpoint is not None else self.run_dir / CHECKPOINT_DIR
        info = load_checkpoint(folder, self.state)
        return info["iteration"], info["extra"]["version"], info["extra"].get("spread_reference")

    # ---- the final weights -----------------------------------------------------------------------
    def save_final(self, folder: Path, iteration: int, version: int) -> dict[str, str]:
        """What the run leaves for diffusers users (`learner.export`): `transformer/` (θ as evaluated —
        its EMA when kept — merged, loadable with the family's `from_pretrained`), `lora/` (that policy's
        adapter in diffusers' format, LoRA runs), `sampling_transformer.safetensors` (θ_old), `run.json`
        (iteration, policy version) and the run's `config.json`. Raises
        `learner.checkpoint.NonFiniteWeights`, writing nothing, when a weight is NaN or ±inf.

        Written into the sibling `<folder>.tmp` and renamed into place, replacing an earlier `folder`: a
        write the disk refuses removes `<folder>.tmp` and raises `learner.checkpoint.CheckpointWriteFailed`
        (one line), leaving `folder` as it was — never a half-written one."""
        evaluated, old = merged_weights(self.state, "ema"), self.state.merged_weights("old")
        check_finite(evaluated, f"save_final: refusing to write non-finite weights to {folder / TRANSFORMER_DIR}")
        check_finite(old, f"save_final: refusing to write non-finite weights to {folder / SAMPLING_FILE}")
        tmp, discard = folder.with_name(folder.name + ".tmp"), folder.with_name(folder.name + ".discard")
        for stale in (tmp, discard):  # what a killed save left
            shutil.rmtree(stale, ignore_errors=True)
        kept = f"the earlier {folder} is intact" if folder.exists() else f"there is no {folder}"
        with written_into(tmp, folder, "the final weights", kept):
            tmp.mkdir(parents=True)
            save_transformer(self.state, evaluated, tmp / TRANSFORMER_DIR)
            if self.state.mode == "lora":
                save_lora(self.state, "ema", self.config.model.folder(), tmp / LORA_DIR)
            write_safetensors(tmp / SAMPLING_FILE, old, {"iteration": iteration, "policy_version": version})
            (tmp / "run.json").write_text(json.dumps({"iteration": iteration, "policy_version": version,
                                                      "policy": "ema" if self.state.ema else "theta"}) + "\n")
            (tmp / "config.json").write_text(self.config.model_dump_json(indent=2) + "\n")
        if folder.exists():
            folder.rename(discard)
        tmp.rename(folder)
        shutil.rmtree(discard, ignore_errors=True)
        files = {"transformer": str(folder / TRANSFORMER_DIR)}
        if self.state.mode == "lora":
            files["lora"] = str(folder / LORA_DIR)
        files["sampling"] = str(folder / SAMPLING_FILE)
        return files
