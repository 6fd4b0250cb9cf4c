"""The Sol-RL trainer: the learner's three parts composed, and the single-process loop.

    rollout      pool → select → regenerate, per prompt slot  (`learner.slot_rollout.SlotRollout`)
    update       advantages → objective → soft update → EMA   (`learner.updater.Updater`)
    bookkeeping  evaluation, checkpoints, resume, final weights (`learner.bookkeeping.Bookkeeping`, rank 0)
    publish      θ_old to the low-precision engine(s): a separate step, called by whoever drives the loop

Which phases run, in which precision and with which step count is the algorithm's record
(`learner.algorithms.ALGORITHMS`); prompts and seeds are pure functions of (run seed, iteration, slot).
The Ray learner actor (`actors.learner`) composes the same parts through this class; `run` is the
loop without Ray, writing the same `IterationRecord` through the same `RunLog`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from diffusion.explore import ExploreEngine, explore_plan
from diffusion.loading import load_policy_from_config
from diffusion.noise import iteration_prompts, lora_init_seed
from diffusion.policy import FlowPolicy
from diffusion.progress import Progress
from diffusion.prompts import load_prompt_set
from learner.algorithms import ALGORITHMS
from learner.bookkeeping import Bookkeeping
from learner.checkpoint import check_finite
from learner.config import TrainerConfig
from learner.data_parallel import ALONE, Shard
from learner.fidelity import rank_fidelity
from learner.iteration_record import Finished, IterationRecord, Published, TrainResult, Work
from learner.rollouts import Generated, Group, RankedGroup, spread_reference
from learner.run_log import RunLog, progress_line, read_base_evaluation
from learner.slot_rollout import SlotRollout
from learner.training_state import TrainingState
from learner.updater import Updater
from rewards import Reward, build_reward_from_config
from rewards.config import is_single


def batch_scores(config: TrainerConfig, batch: list[Group]) -> dict[str, float]:
    """The whole batch's reward numbers: mean and max, each configured reward's mean before weighting
    (`reward_<name>`), the digit accuracy when the reward reports it, and the proxy's rank fidelity."""
    rewards = torch.stack([g.samples.rewards for g in batch])
    scores = {"reward_mean": float(rewards.mean()), "reward_max": float(rewards.max())}
    weights = config.reward.weights
    if is_single(config.reward):  # the total is the one reward itself
        (name,) = weights
        scores[f"reward_{name}"] = float(rewards.float().mean() / weights[name])
    else:  # a weighted sum reports its components in the details under their names
        scores.update({f"reward_{name}": float(torch.cat([g.samples.details[name] for g in batch]).float().mean())
                       for name in weights})
    if "accuracy" in batch[0].samples.details:
        scores["accuracy"] = float(torch.cat([g.samples.details["accuracy"] for g in batch]).mean())
    scores.update(rank_fidelity([(g.proxy, g.samples.rewards) for g in batch if g.proxy is not None]))
    return scores


class Trainer:
    def __init__(self, config: TrainerConfig, run_dir: str | Path | None = None, *,
                 remote_explorers: bool = False, reward: Reward | None = None, shard: Shard = ALONE,
                 policy: FlowPolicy | None = None) -> None:
        """`remote_explorers`: explorer actors rank the pools (the Ray learner), so no local engine is
        built unless the algorithm trains on low-precision samples. `reward`: the configured reward when
        it is computed elsewhere (scorer actors); None builds it here. `shard`: this trainer's rank in a
        learner group (`learner.data_parallel`): it rolls out and trains on its slots only. `run_dir`:
        where checkpoints (and, in `run`, the run's log) go; only rank 0 is given one. `policy`: the model
        already loaded from config.model (`cluster.evaluate` merges a LoRA into it first); None loads it."""
        self.config, self.shard, self.seed = config, shard, config.run.seed
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.policy = policy if policy is not None else load_policy_from_config(config.model)
        self.reward = reward if reward is not None else build_reward_from_config(config.reward)
        # What the explore engines quantize (the nvfp4 weight-sync codec packs exactly these weights).
        self.explore_plan = explore_plan(self.policy, config.explore)
        algorithm = ALGORITHMS[config.learner.algorithm]
        # The engine copies the plain transformer, before LoRA is injected into it.
        local = algorithm.explore == "low" and not (remote_explorers and algorithm.remote_explore)
        engine = ExploreEngine(self.policy, config.explore) if local else None
        self.state = TrainingState.from_policy(self.policy, config.training, seed=lora_init_seed(self.seed))
        self.prompt_set = load_prompt_set(config.prompts.source)
        self.rollouts = SlotRollout(config, self.policy, self.reward, self.state, self.prompt_set, engine)
        self.updater = Updater(config, self.policy, self.state, shard)
        self.books = Bookkeeping(config, self.policy, self.state, self.reward, self.run_dir)
        self.iteration = 0
        # The spread schedule's reference for `self.iteration` (`learner.rollouts.spread_reference` of the
        # iteration before; None: every slot explores all N). Checkpointed, so a resume continues with it.
        self.spread_reference: float | None = None
        self.log: RunLog | None = None  # opened by `run` / `evaluate_base`, at the iteration they start from

    @property
    def version(self) -> int:
        return self.updater.version

    @version.setter
    def version(self, value: int) -> None:
        self.updater.version = value

    @property
    def engine(self) -> ExploreEngine | None:
        return self.rollouts.engine

    @property
    def history(self) -> list[dict[str, Any]]:
        return self.log.history if self.log is not None else []

    def prompts_for(self, iteration: int) -> list[str]:
        return iteration_prompts(self.prompt_set.texts, self.seed, iteration, self.config.prompts.per_iteration)

    def rollout(self, iteration: int, slot: int, prompt: str, ranked: RankedGroup | None = None) -> Group:
        return self.rollouts.rollout(iteration, slot, prompt, self.version, ranked, self.spread_reference)

    def stream(self, iteration: int, group: RankedGroup) -> float:
        """Roll out one ranked group as it arrives (`SlotRollout.stream`); seconds."""
        if iteration != self.iteration:
            raise ValueError(f"learner is at iteration {self.iteration}, asked to regenerate {iteration}")
        return self.rollouts.stream(iteration, group, self.version)

    # ---- one iteration ---------------------------------------------------------------------------
    def train_iteration(self, iteration: int, groups: list[RankedGroup] | None = None) -> TrainResult:
        """rollout → advantages → update → soft update. `groups`: ranked groups from explorers (None: the
        pools are ranked here). In a learner group each rank rolls out its own slots and the whole batch's
        scores are gathered. Publishing is the caller's next step."""
        start, sampled_with = time.perf_counter(), self.version
        slots = [(slot, p) for slot, p in enumerate(self.prompts_for(iteration))
                 if self.shard.owns(slot, self.config.prompts.per_iteration)]
        mine, streamed, streamed_s = self.rollouts.collect(iteration, slots, groups, self.version,
                                                           self.spread_reference)
        rollout_s = time.perf_counter() - start
        if self.config.explore.schedule == "spread":
            self.spread_reference = self._next_spread_reference(groups, mine)
        batch = self._whole_batch([slot for slot, _ in slots], mine)
        t0 = time.perf_counter()
        update = self.updater.step(iteration, batch, mine, [slot for slot, _ in slots])
        work = sum((g.work for g in mine), Work()) + Work(train_passes=update.passes)
        # The kept seeds were regenerated by the sampling policy of `sampled_with`, however old the policy
        # that ranked them: asynchrony only makes the *choice* of seeds stale.
        return TrainResult(
            iteration, self.version, sampled_with, update.skipped, work, batch_scores(self.config, batch),
            update.losses, rollout_s, time.perf_counter() - t0, time.perf_counter() - start,
            proxy_reward_mean=None if not groups else float(torch.cat([g.proxy for g in groups]).mean()),
            streamed_slots=None if groups is None else streamed, streamed_rollout_s=streamed_s,
            step_s=self.rollouts.step_times())

    def _next_spread_reference(self, groups: list[RankedGroup] | None, mine: list[Group]) -> float | None:
        """The spread schedule's reference for the next iteration, from every slot of this one: the
        explorers' groups (every rank is given all of them), or the pools ranked here, gathered over the
        learner group."""
        if groups is not None:
            return spread_reference(g.first_spread for g in groups)
        return spread_reference(s for part in self.shard.gather([g.first_spread for g in mine]) for s in part)

    def _whole_batch(self, slots: list[int], mine: list[Group]) -> list[Group]:
        """Every slot's scores in slot order: this rank's groups, with the other ranks' scores gathered
        (rewards, details and proxies only; samples stay where they were made)."""
        if self.shard.world == 1:
            return mine
        scores = [(slot, Group(g.prompt, Generated(g.samples.seeds, torch.empty(0), g.samples.rewards,
                                                   details=g.samples.details), g.proxy))
                  for slot, g in zip(slots, mine, strict=True)]
        return [g for _, g in sorted((pair for part in self.shard.gather(scores) for pair in part),
                                     key=lambda pair: pair[0])]

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
        if self.engine is not None and self.rollouts.engine_version != self.version:
            self.rollouts.load_engine(self.sampling_weights() if weights is None else weights, self.version)
        return time.perf_counter() - start

    def finish_iteration(self) -> Finished:
        """Count the iteration; rank 0 evaluates when due (with the experiment log's grid)."""
        self.iteration += 1
        if not (self.shard.main and self.books.evaluation_due(self.iteration)):
            return Finished({})
        return Finished(self.books.evaluate(), self.books.logged_grid())

    def checkpoint(self) -> None:
        """After the iteration's record is written (so a resumed run never lacks a line): when due."""
        if self.shard.main and self.books.checkpoint_due(self.iteration):
            self.books.checkpoint(self.iteration, self.version, self.shard.world, self.spread_reference)

    # ---- the single-process loop -----------------------------------------------------------------
    def open_log(self) -> RunLog:
        if self.log is None:
            self.log = RunLog(self.run_dir, self.config, start=self.iteration)
        return self.log

    def run(self, iterations: int | None = None, log=print) -> list[dict[str, Any]]:
        total = self.config.run.iterations if iterations is None else iterations
        run_log, progress = self.open_log(), Progress("iteration", total, done=self.iteration)
        self.publish()  # a resumed trainer's engine catches up first
        while self.iteration < total:
            start = time.perf_counter()
            result = self.train_iteration(self.iteration)
            published = Published(self.version, self.publish())
            finished = self.finish_iteration()
            skipped = run_log.skipped_updates() + result.skipped
            row = run_log.write(IterationRecord(result, result.work, published, finished, skipped,
                                                iteration_wall_s=time.perf_counter() - start))
            self.checkpoint()
            log(progress_line(row, progress))
        return self.history

    # ---- evaluation, resume, final weights (rank 0) ----------------------------------------------
    @property
    def base_eval(self) -> dict[str, float]:
        if self.log is not None:
            return self.log.base
        return read_base_evaluation(self.run_dir) if self.run_dir is not None else {}

    @property
    def eval_sampling(self):
        return self.books.eval_sampling

    @property
    def eval_prompts(self) -> list[str]:
        return self.books.eval_prompts

    def evaluate(self, progress: Callable[[int], object] | None = None) -> dict[str, float]:
        return self.books.evaluate(progress)

    def base_evaluation(self) -> tuple[dict[str, float], Any]:
        """The base model's held-out reward (and the experiment log's grid), before any update."""
        if self.version != 0:
            raise RuntimeError(f"the base model is version 0; this trainer holds version {self.version}")
        return self.books.evaluate(), self.books.logged_grid()

    def evaluate_base(self) -> dict[str, float]:
        """`base_evaluation`, written to this trainer's log (base_eval.json, the experiment log's step 0)."""
        evaluation, grid = self.base_evaluation()
        self.open_log().write_base(evaluation, grid)
        return evaluation

    def logged_grid(self):
        return self.books.logged_grid()

    def sample_images(self, seeds_per_prompt: int = 6, *, base: bool = False) -> torch.Tensor:
        return self.books.sample_images(seeds_per_prompt, base=base)

    def resume(self, checkpoint: str | Path | None = None) -> None:
        """Continue from run_dir/checkpoint (or the folder given): bitwise the same continuation as not
        stopping (on CPU), once the caller publishes; the run's log is cut to the checkpoint when opened."""
        self.iteration, self.version, self.spread_reference = self.books.resume(checkpoint)

    def save_final(self, folder: Path) -> dict[str, str]:
        return self.books.save_final(folder, self.iteration, self.version)
