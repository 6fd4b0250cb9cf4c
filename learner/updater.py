"""The update part of the learner, over a `TrainingState`: advantages → objective → soft update → EMA.

    advantages   from the batch's K true rewards per prompt (`OBJECTIVES[objective].advantages`)
    update       the objective's optimizer step(s) on θ (`learner.updates`)
    soft-update  θ_old ← d·θ_old + (1 − d)·θ with d = `learner.decay.decay(version)` (the EMA of θ follows
                 each optimizer step: `TrainingState.step`)

A non-finite reward trains nothing: the step is skipped and the policy version stays (nothing new to
publish). `version` counts the successful updates; it names the sampling policy everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffusion.noise import Stream, stream_generator
from diffusion.policy import FlowPolicy
from learner.config import TrainerConfig
from learner.data_parallel import ALONE, Shard
from learner.rollouts import Group, regeneration_sampling
from learner.training_state import TrainingState
from learner.updates import OBJECTIVES, UpdateContext


@dataclass
class Update:
    losses: dict[str, float]
    skipped: bool
    passes: int  # per-sample model passes (`UpdateContext.passes`)


class Updater:
    def __init__(self, config: TrainerConfig, policy: FlowPolicy, state: TrainingState, shard: Shard = ALONE) -> None:
        self.config, self.policy, self.state, self.shard = config, policy, state, shard
        self.objective = OBJECTIVES[config.learner.objective]
        self.sigmas = policy.sigmas(regeneration_sampling(config, self.objective.rollout_solver).steps)
        self.version = 0  # policy version: successful updates so far

    def rewards_for_update(self, iteration: int, groups: list[Group]) -> torch.Tensor:
        """The batch's true rewards [P, K]; `learner.shuffle_rewards` (a control) breaks the reward ↔ sample
        link within each prompt."""
        rewards = torch.stack([g.samples.rewards for g in groups])
        if self.config.learner.shuffle_rewards:
            g = stream_generator(self.config.run.seed, iteration, Stream.SHUFFLE)
            rewards = torch.stack([row[torch.randperm(row.numel(), generator=g)] for row in rewards])
        return rewards

    def update(self, iteration: int, groups: list[Group], advantages: torch.Tensor,
               slots: list[int] | None = None, batch_advantages: torch.Tensor | None = None
               ) -> tuple[dict[str, float], int]:
        """The objective's step(s) on `groups`, the rollouts of `slots` (default: every slot, in order), with
        their `advantages` (`batch_advantages`: the whole batch's, when `groups` are a rank's part); its numbers
        and the model passes it took."""
        context = UpdateContext(self.policy, self.state, self.config.learner, self.sigmas, self.config.run.seed,
                                iteration, slots=list(range(len(groups))) if slots is None else slots,
                                batch_slots=len(groups) if slots is None else self.config.prompts.per_iteration,
                                shard=self.shard, sde_noise_level=self.config.sampler.sde_noise_level,
                                cfg_scale=self.config.sampler.cfg_scale, batch_advantages=batch_advantages)
        losses = self.objective.update(context, groups, advantages)
        return losses, context.passes

    def step(self, iteration: int, batch: list[Group], mine: list[Group], slots: list[int]) -> Update:
        """One iteration's update: `batch` holds every slot's scores (the whole learner group's), `mine` this
        rank's rollouts of `slots`."""
        rewards = self.rewards_for_update(iteration, batch)
        skipped_before, losses, passes = self.state.skipped_steps, {}, 0
        if not bool(torch.isfinite(rewards).all()):
            self.state.skip_step()  # a broken reward trains nothing and publishes nothing
        else:
            advantages = self.objective.advantages(rewards, self.config.learner)
            losses, passes = self.update(iteration, mine, advantages[slots], slots, advantages)
        skipped = self.state.skipped_steps > skipped_before
        if not skipped:
            self.soft_update()
        return Update(losses, skipped, passes)

    def soft_update(self) -> None:
        """Count the update, then move θ_old toward θ with the update count after the increment (the EMA of θ
        follows each optimizer step: `TrainingState.step`)."""
        self.version += 1
        self.state.soft_update(self.config.learner.decay.decay(self.version))
