"""The Sol-RL trainer, one process: each iteration is a sequence of named phases.

    explore      N seeds of each prompt slot sampled by the cheap pass and scored (proxy rewards)
    select       K of them by proxy reward (`learner.selection`)
    regenerate   the K chosen seeds sampled again by the sampling policy θ_old in full precision
    advantages   from the K true rewards (`learner.updates.OBJECTIVES[objective].advantages`)
    update       the objective's optimizer step(s) on θ
    soft-update  θ_old ← d·θ_old + (1 − d)·θ, and the EMA of θ
    publish      θ_old to the low-precision engine(s): a separate step, called by the driver

Which phases run, in which precision and with which step count is the algorithm's record
(`learner.algorithms.ALGORITHMS`); prompts and seeds are pure functions of (run seed, iteration,
slot). The Ray learner actor wraps this class; explorers call `learner.rollouts.explore_group`, the
same function the explore phase uses here.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.stats import spearmanr

from diffusion.explore import ExploreEngine, explore_plan
from diffusion.loading import load_policy_from_config
from diffusion.noise import Stream, candidate_seeds, lora_init_seed, stream_generator
from diffusion.progress import Progress
from diffusion.prompts import load_prompt_set
from learner.algorithms import ALGORITHMS
from learner.checkpoint import check_finite, load_checkpoint, save_checkpoint, write_safetensors, written_into
from learner.config import TrainerConfig
from learner.data_parallel import ALONE, Shard
from learner.evaluation import evaluate, grid_samples, sample_grid
from learner.experiment_log import ExperimentLog, GridSamples
from learner.export import LORA_DIR, TRANSFORMER_DIR, merged_weights, save_lora, save_transformer
from learner.rollouts import (
    Generated,
    Group,
    RankedGroup,
    evaluation_sampling,
    exploration_sampling,
    explore_group,
    generate,
    regeneration_sampling,
)
from learner.run_log import append_metrics, progress_line, truncate_metrics
from learner.selection import select_candidates
from learner.training_state import TrainingState
from learner.updates import OBJECTIVES, UpdateContext
from rewards import Reward, build_reward_from_config

BASE_EVAL_FILE = "base_eval.json"
SAMPLING_FILE = "sampling_transformer.safetensors"  # θ_old, the policy the explorers held last
# Work an iteration counts (a learner group's ranks sum theirs): sample-steps of the kept samples in full
# precision, of a pool in full or low precision, and training's per-sample model passes
# (`learner.updates.UpdateContext.passes`). bench.convergence prices each at the paper's Table 5 rates.
COUNTED_WORK = ("fp_sample_steps", "fp_pool_sample_steps", "lp_sample_steps", "train_passes")


def reward_components(weights: dict[str, float], groups: list[Group]) -> dict[str, float]:
    """`reward_<name>`: each configured reward's mean over the kept samples, before weighting (a
    weighted sum reports its components in the details under their names)."""
    if len(weights) == 1:
        (name,) = weights
        return {f"reward_{name}": float(torch.cat([g.samples.rewards for g in groups]).float().mean() / weights[name])}
    return {f"reward_{name}": float(torch.cat([g.samples.details[name] for g in groups]).float().mean())
            for name in weights}


def prompts_for(prompts: list[str], run_seed: int, iteration: int, count: int) -> list[str]:
    """The iteration's prompt slots: a permutation seeded by (run seed, iteration), cycled to `count`."""
    order = torch.randperm(len(prompts), generator=stream_generator(run_seed, iteration, Stream.PROMPTS))
    return [prompts[order[i % len(prompts)]] for i in range(count)]


class Trainer:
    def __init__(self, config: TrainerConfig, run_dir: str | Path | None = None, *,
                 remote_explorers: bool = False, reward: Reward | None = None, shard: Shard = ALONE) -> None:
        """`remote_explorers`: explorer actors rank the pools (the Ray learner), so no local engine is
        built unless the algorithm trains on low-precision samples. `reward`: the configured reward when
        it is computed elsewhere (scorer actors); None builds it here. `shard`: this trainer's rank in a
        learner group (`learner.data_parallel`): it rolls out and trains on its slots only; only rank 0
        evaluates and writes to `run_dir`. Nothing is published here."""
        self.config = config
        self.shard = shard
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.seed = config.run.seed
        self.algorithm = ALGORITHMS[config.learner.algorithm]
        self.objective = OBJECTIVES[config.learner.objective]
        self.policy = load_policy_from_config(config.model)
        self.reward = reward if reward is not None else build_reward_from_config(config.reward)
        # What the explore engines quantize (the nvfp4 weight-sync codec packs exactly these weights).
        self.explore_plan = explore_plan(self.policy, config.explore)
        # The engine copies the plain transformer, before LoRA is injected into it.
        local = self.algorithm.explore == "low" and not (remote_explorers and self.algorithm.remote_explore)
        self.engine = ExploreEngine(self.policy, config.explore) if local else None
        self.state = TrainingState.from_policy(self.policy, config.training,
                                               seed=lora_init_seed(self.seed))
        self.regen_sampling = regeneration_sampling(config, self.objective.rollout_solver)
        self.explore_sampling = exploration_sampling(config)
        self.eval_sampling = evaluation_sampling(config)
        self.prompt_set = load_prompt_set(config.prompts.source)
        self.eval_prompt_set = load_prompt_set(config.prompts.eval_source, heldout=True)
        self.prompts = self.prompt_set.texts
        self.eval_prompts = self.eval_prompt_set.texts[: config.eval.prompts]
        self.iteration = 0
        self.version = 0  # policy version: successful updates so far
        self.engine_version = 0 if self.engine is not None else None  # the engine starts as the base model
        self.counters = {**dict.fromkeys(COUNTED_WORK, 0), "skipped_updates": 0}
        self._counted = dict(self.counters)  # at the start of this iteration (streamed rollouts count in it)
        self.history: list[dict[str, Any]] = []
        self.base_eval: dict[str, float] = {}
        # W&B / TensorBoard, when the config asks: only a trainer with a run directory (rank 0) logs
        self.experiment = ExperimentLog.open(config.logging, self.run_dir, self.run_dir.name,
                                             config.model_dump(mode="json")) if self.run_dir is not None else None

    def prompts_for(self, iteration: int) -> list[str]:
        return prompts_for(self.prompts, self.seed, iteration, self.config.prompts.per_iteration)

    # ---- explore → select → regenerate -----------------------------------------------------------
    def _engine(self) -> torch.nn.Module:
        if self.engine_version != self.version:  # silently stale weights are the classic engine bug
            raise RuntimeError(f"the explore engine holds policy version {self.engine_version}, the trainer "
                               f"{self.version}: call publish() after each update (and after resume)")
        return self.engine.module

    def explore(self, iteration: int, slot: int, prompt: str, *, return_states: bool = False) -> Generated:
        """The pool: N seeds sampled by the algorithm's cheap pass (low precision, or full) and scored."""
        low = self.algorithm.explore == "low"
        sampling = self.explore_sampling if self.algorithm.explore_steps == "explore" else self.regen_sampling
        seeds = candidate_seeds(self.seed, iteration, slot, self.config.prompts.candidates)
        self.counters["lp_sample_steps" if low else "fp_pool_sample_steps"] += len(seeds) * sampling.steps
        if low:
            return generate(self.policy, self._engine(), self.reward, prompt, seeds, sampling,
                            return_states=return_states, metadata=self.prompt_set.metadata_of(prompt))
        with self.state.use("old") as model:
            return generate(self.policy, model, self.reward, prompt, seeds, sampling, return_states=return_states,
                            metadata=self.prompt_set.metadata_of(prompt))

    def explore_ranked(self, iteration: int, slot: int, prompt: str) -> RankedGroup:
        """What an explorer actor returns for one slot, computed here (sol_rl without actors)."""
        self.counters["lp_sample_steps"] += self.explore_sampling.pool_steps(self.config.prompts.candidates)
        seeds = candidate_seeds(self.seed, iteration, slot, self.config.prompts.candidates)
        return explore_group(self.policy, self._engine(), self.reward, iteration=iteration, slot=slot,
                             prompt=prompt, seeds=seeds, sampling=self.explore_sampling, policy_version=self.version,
                             metadata=self.prompt_set.metadata_of(prompt)[0])

    def select(self, group: RankedGroup) -> torch.Tensor:
        generator = stream_generator(self.seed, group.iteration, Stream.SELECTION, group.slot)
        return select_candidates(group.proxy, self.config.prompts.keep, self.config.learner.selection, generator)

    def regenerate(self, prompt: str, seeds: list[int]) -> Generated:
        """The kept seeds, sampled by θ_old in full precision: the samples the update trains on."""
        self.counters["fp_sample_steps"] += len(seeds) * self.regen_sampling.steps
        with self.state.use("old") as model:
            return generate(self.policy, model, self.reward, prompt, seeds, self.regen_sampling,
                            return_states=self.objective.needs_states, metadata=self.prompt_set.metadata_of(prompt))

    def rollout(self, iteration: int, slot: int, prompt: str, ranked: RankedGroup | None = None) -> Group:
        """One slot's K training samples, by the algorithm's record. `ranked` may come from an explorer."""
        algorithm, keep = self.algorithm, self.config.prompts.keep
        if algorithm.explore is None:  # DiffusionNFT: K seeds, no pool
            return Group(prompt, self.regenerate(prompt, candidate_seeds(self.seed, iteration, slot, keep)), None)
        if algorithm.regenerate:  # Sol-RL: only (seed, proxy reward) pairs are needed from the pool
            ranked = ranked or self.explore_ranked(iteration, slot, prompt)
            chosen = self.select(ranked)
            return Group(prompt, self.regenerate(prompt, [ranked.seeds[i] for i in chosen]), ranked.proxy[chosen])
        pool = self.explore(iteration, slot, prompt, return_states=self.objective.needs_states)
        chosen = self.select(RankedGroup(iteration, slot, prompt, pool.seeds, pool.rewards, self.version))
        return Group(prompt, pool.take(chosen), None)

    # ---- advantages → update → soft-update -------------------------------------------------------
    def rewards_for_update(self, iteration: int, groups: list[Group]) -> torch.Tensor:
        rewards = torch.stack([g.samples.rewards for g in groups])  # [P, K]
        if self.config.learner.shuffle_rewards:  # control: break the reward ↔ sample link within each prompt
            g = stream_generator(self.seed, iteration, Stream.SHUFFLE)
            rewards = torch.stack([row[torch.randperm(row.numel(), generator=g)] for row in rewards])
        return rewards

    def update(self, iteration: int, groups: list[Group], advantages: torch.Tensor,
               slots: list[int] | None = None) -> dict[str, float]:
        """The objective's step(s) on `groups`, the rollouts of `slots` (default: every slot, in order)."""
        context = UpdateContext(self.policy, self.state, self.config.learner, self.policy.sigmas(
            self.regen_sampling.steps), self.seed, iteration,
            slots=list(range(len(groups))) if slots is None else slots,
            batch_slots=len(groups) if slots is None else self.config.prompts.per_iteration, shard=self.shard,
            sde_noise_level=self.config.sampler.sde_noise_level)
        metrics = self.objective.update(context, groups, advantages)
        self.counters["train_passes"] += context.passes
        return metrics

    def soft_update(self) -> None:
        """Count the update, then move θ_old and the EMA toward θ with the step count after the increment."""
        self.version += 1
        self.state.update_ema(self.version)
        self.state.soft_update(self.config.learner.decay.decay(self.version))

    def train_iteration(self, iteration: int, groups: list[RankedGroup] | None = None,
                        rolled: dict[int, Group] | None = None) -> dict[str, Any]:
        """explore → select → regenerate → advantages → update → soft-update; `groups` are ranked groups
        from explorers (sol_rl), else the pools are explored here; `rolled`: slots whose rollout was already
        made from those groups (streamed as they arrived, by this trainer, with this policy). In a learner
        group each rank rolls out its own slots and the whole batch's scores are gathered. Publishing is
        the caller's next step."""
        start = time.perf_counter()
        before, rolled = self._counted, rolled or {}
        by_slot = {g.slot: g for g in groups or []}
        slots = [(slot, p) for slot, p in enumerate(self.prompts_for(iteration)) if self.shard.owns(slot)]
        collected = [rolled[slot] if slot in rolled else self.rollout(iteration, slot, p, by_slot.get(slot))
                     for slot, p in slots]
        rollout_s = time.perf_counter() - start
        batch = self._whole_batch([slot for slot, _ in slots], collected)
        rewards = self.rewards_for_update(iteration, batch)
        # The kept seeds were regenerated by the current sampling policy (version self.version), however
        # old the policy that ranked them: asynchrony only makes the *choice* of seeds stale.
        metrics: dict[str, Any] = {"iteration": iteration, "policy_version": self.version,
                                   "sampled_with_version": self.version,
                                   "reward_mean": float(rewards.mean()), "reward_max": float(rewards.max())}
        metrics.update(reward_components(self.config.reward.weights, batch))
        if "accuracy" in batch[0].samples.details:
            metrics["accuracy"] = float(torch.cat([g.samples.details["accuracy"] for g in batch]).mean())
        metrics.update(rank_fidelity(batch))
        t0 = time.perf_counter()
        skipped_before = self.state.skipped_steps
        if not bool(torch.isfinite(rewards).all()):
            self.state.skip_step()  # a broken reward trains nothing and publishes nothing
        else:
            advantages = self.objective.advantages(rewards, self.config.learner)[[slot for slot, _ in slots]]
            metrics.update(self.update(iteration, collected, advantages, [slot for slot, _ in slots]))
        if self.state.skipped_steps > skipped_before:
            self.counters["skipped_updates"] += 1
            metrics["skipped"] = True
        else:
            self.soft_update()
        steps = self.shard.sum({k: self.counters[k] - before[k] for k in COUNTED_WORK})
        self.counters.update({k: before[k] + int(v) for k, v in steps.items()})  # the group's, on every rank
        metrics.update({"rollout_s": rollout_s, "train_s": time.perf_counter() - t0,
                        "iteration_s": time.perf_counter() - start, **{k: int(v) for k, v in steps.items()},
                        "skipped_updates": self.counters["skipped_updates"]})
        return metrics

    def _whole_batch(self, slots: list[int], collected: list[Group]) -> list[Group]:
        """Every slot's scores in slot order: this rank's groups, with the other ranks' scores gathered
        (rewards, details and proxies only; samples stay where they were made)."""
        if self.shard.world == 1:
            return collected
        mine = [(slot, Group(g.prompt, Generated(g.samples.seeds, torch.empty(0), g.samples.rewards,
                                                 details=g.samples.details), g.proxy))
                for slot, g in zip(slots, collected, strict=True)]
        return [g for _, g in sorted((pair for part in self.shard.gather(mine) for pair in part),
                                     key=lambda pair: pair[0])]

    # ---- publish ---------------------------------------------------------------------------------
    def sampling_weights(self) -> dict[str, torch.Tensor]:
        """θ_old merged into the plain transformer's keys: what every explore engine must hold. Raises
        `learner.checkpoint.NonFiniteWeights` when a weight is NaN or ±inf: explorers never rank with a
        broken policy."""
        weights = self.state.sampling_weights()
        check_finite(weights, f"publish: refusing to publish a non-finite sampling policy (version {self.version})")
        return weights

    def publish(self, weights: dict[str, torch.Tensor] | None = None) -> float:
        """Load θ_old into the local engine, if this trainer has one and it is behind; seconds spent."""
        start = time.perf_counter()
        if self.engine is not None and self.engine_version != self.version:
            self.engine.load(self.sampling_weights() if weights is None else weights)
            self.engine_version = self.version
        return time.perf_counter() - start

    # ---- evaluation ------------------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """Held-out prompts × fixed seeds, full precision, `eval.steps`, θ as evaluated (its EMA when kept)."""
        return evaluate(self.policy, self.state, self.reward, self.eval_prompts, prompt_set=self.eval_prompt_set,
                        run_seed=self.seed, seeds_per_prompt=self.config.eval.seeds_per_prompt,
                        sampling=self.eval_sampling)

    def sample_images(self, seeds_per_prompt: int = 6) -> torch.Tensor:
        """Held-out prompts × fixed seeds: images [P·S, C, H, W] (`learner.evaluation.sample_grid`)."""
        return sample_grid(self.policy, self.state, self.eval_prompts, run_seed=self.seed,
                           seeds_per_prompt=seeds_per_prompt, sampling=self.eval_sampling)

    def evaluate_base(self) -> dict[str, float]:
        """The base model's held-out reward, before any update; kept in run_dir for resumed runs (and step 0
        of the experiment log)."""
        if self.version != 0:
            raise RuntimeError(f"the base model is version 0; this trainer holds version {self.version}")
        self.base_eval = self.evaluate()
        if self.run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / BASE_EVAL_FILE).write_text(json.dumps(self.base_eval) + "\n")
        if self.experiment is not None:
            self.experiment.log(0, self.base_eval, self.logged_grid())
        return self.base_eval

    def logged_grid(self) -> GridSamples:
        """The experiment log's held-out grid: `logging.grid_prompts` × `logging.grid_seeds`, each scored."""
        c = self.config.logging
        prompts = self.eval_prompts[: c.grid_prompts]
        out = grid_samples(self.policy, self.state, prompts, run_seed=self.seed, seeds_per_prompt=c.grid_seeds,
                           sampling=self.eval_sampling, reward=self.reward, prompt_set=self.eval_prompt_set)
        return GridSamples([p for p in prompts for _ in range(c.grid_seeds)], out.images, out.rewards, c.grid_seeds)

    def log_experiment(self, metrics: dict[str, Any]) -> None:
        """An iteration's record to W&B / TensorBoard (after an evaluation, with the held-out grid); the
        caller's last step of an iteration, so that what it adds to the record (the learner's idle
        fraction) is logged too. The log closes after the run's last iteration."""
        if self.experiment is None:
            return
        step = metrics["iteration"] + 1
        self.experiment.log(step, metrics, self.logged_grid() if "eval_reward" in metrics else None)
        if step >= self.config.run.iterations:
            self.experiment.close()

    # ---- the loop, checkpoints -------------------------------------------------------------------
    def finish_iteration(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """After an update (and its publication): count it, evaluate when due, log, checkpoint when due."""
        self.iteration += 1
        self._counted = dict(self.counters)
        every, total, ckpt = self.config.eval.every, self.config.run.iterations, self.config.run.checkpoint_every
        if every and self.shard.main and (self.iteration % every == 0 or self.iteration == total):
            metrics.update(self.evaluate())
        metrics["policy_version"] = self.version
        self.history.append(metrics)
        if self.run_dir is not None:
            append_metrics(self.run_dir / "metrics.jsonl", metrics)
            if (ckpt and self.iteration % ckpt == 0) or self.iteration == total:
                self.checkpoint()
        return metrics

    def run(self, iterations: int | None = None, log=print) -> list[dict[str, Any]]:
        total = self.config.run.iterations if iterations is None else iterations
        self.publish()  # a resumed trainer's engine catches up first
        progress = Progress("iteration", total, done=self.iteration)
        while self.iteration < total:
            metrics = self.train_iteration(self.iteration)
            metrics["sync_s"] = self.publish()
            metrics = self.finish_iteration(metrics)
            self.log_experiment(metrics)
            log(progress_line(metrics, progress))
        return self.history

    def checkpoint(self) -> None:
        if self.run_dir is not None:
            save_checkpoint(self.run_dir / "checkpoint", self.state, iteration=self.iteration,
                            extra={"version": self.version, "counters": self.counters,
                                   "learners": self.shard.world})  # L: a resume with another L is another run

    def resume(self, checkpoint: str | Path | None = None) -> None:
        """Continue from run_dir/checkpoint (or the folder given): bitwise the same continuation as not
        stopping (on CPU), once the caller publishes. The run's history comes back with it: metrics.jsonl
        is cut to the checkpoint's iteration (lines logged after it are redone), the base evaluation is
        reloaded."""
        folder = Path(checkpoint) if checkpoint is not None else self.run_dir / "checkpoint"
        info = load_checkpoint(folder, self.state)
        self.iteration, self.version = info["iteration"], info["extra"]["version"]
        self.counters = {**dict.fromkeys(self.counters, 0), **info["extra"]["counters"]}  # older: fewer keys
        self._counted = dict(self.counters)
        if self.run_dir is not None:  # the run's bookkeeping (a learner group's other ranks keep none)
            self.history = truncate_metrics(self.run_dir / "metrics.jsonl", self.iteration)
            base = self.run_dir / BASE_EVAL_FILE
            self.base_eval = json.loads(base.read_text()) if base.is_file() else {}

    def save_final(self, folder: Path) -> dict[str, str]:
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
            write_safetensors(tmp / SAMPLING_FILE, old, {"iteration": self.iteration, "policy_version": self.version})
            (tmp / "run.json").write_text(json.dumps({"iteration": self.iteration, "policy_version": self.version,
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

def rank_fidelity(groups: list[Group]) -> dict[str, float]:
    """Spearman ρ of proxy vs true rewards on the kept seeds, and how often the proxy put a seed on the
    right side of the true median (the selection precision)."""
    pairs = [(g.proxy.numpy(), g.samples.rewards.numpy()) for g in groups if g.proxy is not None]
    if not pairs:
        return {}
    rho = [float(spearmanr(p, r).statistic) for p, r in pairs]
    rho = [x for x in rho if not math.isnan(x)] or [math.nan]  # constant rewards have no ρ
    precision = [np.mean((p > np.median(p)) == (r > np.median(r))) for p, r in pairs]
    return {"rank_spearman": float(np.mean(rho)), "selection_precision": float(np.mean(precision))}
