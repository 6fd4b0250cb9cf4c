"""The rollout part of the learner: one prompt slot's K training samples, pool → selection → regeneration.

    pool         N seeds ranked by proxy reward: a `RankedGroup`, from an explorer actor or from the
                 local engine (`ranked`, the same `explore_group` the explorers run)
    select       K of them (`learner.selection`)
    regenerate   the K seeds sampled again by θ_old in full precision: the samples the update trains on

Algorithms without regeneration train on the pool's own samples, which only a local pool has
(`learner.algorithms`). Each `Group` carries the work that made it (`learner.iteration_record.Work`).
A learner actor streams: it rolls a slot out as soon as the slot's ranked group arrives (`stream`),
and `collect` uses that rollout only for exactly the group it was made from.
"""

from __future__ import annotations

import time

import torch

from diffusion.explore import ExploreEngine
from diffusion.noise import Stream, candidate_seeds, stream_generator
from diffusion.policy import FlowPolicy
from diffusion.prompts import PromptSet
from learner.algorithms import ALGORITHMS
from learner.config import TrainerConfig
from learner.iteration_record import Work
from learner.rollouts import (
    Generated,
    Group,
    RankedGroup,
    exploration_sampling,
    explore_group,
    generate,
    regeneration_sampling,
)
from learner.selection import select_candidates
from learner.training_state import TrainingState
from learner.updates import OBJECTIVES
from rewards import Reward


def made_from(a: RankedGroup, b: RankedGroup) -> bool:
    """Whether two ranked groups are the same one (async mode may replace a stale group by one explored again)."""
    return (a.iteration, a.slot, a.policy_version, a.seeds) == (b.iteration, b.slot, b.policy_version, b.seeds) \
        and torch.equal(a.proxy, b.proxy)


class SlotRollout:
    def __init__(self, config: TrainerConfig, policy: FlowPolicy, reward: Reward, state: TrainingState,
                 prompt_set: PromptSet, engine: ExploreEngine | None) -> None:
        """`engine`: the local low-precision engine (None: pools are ranked elsewhere, or in full precision)."""
        self.config, self.policy, self.reward, self.state, self.prompt_set = config, policy, reward, state, prompt_set
        self.seed, self.algorithm = config.run.seed, ALGORITHMS[config.learner.algorithm]
        objective = OBJECTIVES[config.learner.objective]
        self.needs_states = objective.needs_states
        self.regen_sampling = regeneration_sampling(config, objective.rollout_solver)
        self.explore_sampling = exploration_sampling(config)
        self.engine = engine
        self.engine_version = 0 if engine is not None else None  # the engine starts as the base model
        self._streamed: dict[int, tuple[RankedGroup, Group]] = {}  # slot → (its ranked group, its rollout)
        self._streamed_s = 0.0
        self._denoising: dict[str, list[float]] = {"explore": [0.0, 0], "regen": [0.0, 0]}  # seconds, sample-steps

    def step_times(self) -> dict[str, float]:
        """Seconds per sample-step of the local exploration and of the regeneration since the last call
        (`explore_step_s`, `regen_step_s`; each only when it ran), then starts counting again."""
        times = {f"{phase}_step_s": seconds / steps for phase, (seconds, steps) in self._denoising.items() if steps}
        self._denoising = {phase: [0.0, 0] for phase in self._denoising}
        return times

    def _count(self, phase: str, seconds: float, steps: int) -> None:
        self._denoising[phase][0] += seconds
        self._denoising[phase][1] += steps

    def load_engine(self, weights: dict[str, torch.Tensor], version: int) -> None:
        """θ_old of `version` into the local engine (the publish step's local half)."""
        self.engine.load(weights)
        self.engine_version = version

    def _engine(self, version: int) -> torch.nn.Module:
        if self.engine_version != version:  # silently stale weights are the classic engine bug
            raise RuntimeError(f"the explore engine holds policy version {self.engine_version}, the trainer "
                               f"{version}: call publish() after each update (and after resume)")
        return self.engine.module

    def _metadata(self, prompt: str):
        return self.prompt_set.metadata_of(prompt)

    def ranked(self, iteration: int, slot: int, prompt: str, version: int,
               spread_reference: float | None = None) -> RankedGroup:
        """What an explorer actor returns for one slot, computed with the local engine; `spread_reference`:
        the spread schedule's reference for `iteration` (`learner.rollouts.spread_reference`)."""
        seeds = candidate_seeds(self.seed, iteration, slot, self.config.prompts.candidates)
        group = explore_group(self.policy, self._engine(version), self.reward, iteration=iteration, slot=slot,
                              prompt=prompt, seeds=seeds, sampling=self.explore_sampling, policy_version=version,
                              metadata=self._metadata(prompt)[0], spread_reference=spread_reference)
        self._count("explore", group.sample_s, group.sample_steps)
        return group

    def select(self, group: RankedGroup) -> torch.Tensor:
        generator = stream_generator(self.seed, group.iteration, Stream.SELECTION, group.slot)
        return select_candidates(group.proxy, self.config.prompts.keep, self.config.learner.selection, generator)

    def regenerate(self, prompt: str, seeds: list[int]) -> Generated:
        """The kept seeds, sampled by θ_old in full precision: the samples the update trains on."""
        with self.state.use("old") as model:
            out = generate(self.policy, model, self.reward, prompt, seeds, self.regen_sampling,
                           return_states=self.needs_states, metadata=self._metadata(prompt))
        self._count("regen", out.sample_s, self.regen_sampling.sample_steps(len(seeds)))
        return out

    def _pool(self, iteration: int, slot: int, prompt: str, version: int) -> tuple[Generated, Work]:
        """A pool that is trained on (no regeneration): N seeds by the algorithm's pass, full or low precision."""
        low = self.algorithm.explore == "low"
        sampling = self.explore_sampling if self.algorithm.explore_steps == "explore" else self.regen_sampling
        seeds = candidate_seeds(self.seed, iteration, slot, self.config.prompts.candidates)
        steps = sampling.sample_steps(len(seeds))
        if low:
            pool = generate(self.policy, self._engine(version), self.reward, prompt, seeds, sampling,
                            return_states=self.needs_states, metadata=self._metadata(prompt))
            return pool, Work(lp_sample_steps=steps, scored_images=len(seeds))
        with self.state.use("old") as model:
            pool = generate(self.policy, model, self.reward, prompt, seeds, sampling, return_states=self.needs_states,
                            metadata=self._metadata(prompt))
        return pool, Work(fp_pool_sample_steps=steps, scored_images=len(seeds))

    def rollout(self, iteration: int, slot: int, prompt: str, version: int, ranked: RankedGroup | None = None,
                spread_reference: float | None = None) -> Group:
        """One slot's K training samples by the algorithm's record; `ranked`: its pool, ranked by an explorer
        (None: ranked here, when the algorithm has a pool, with `spread_reference` under a spread schedule)."""
        keep = self.config.prompts.keep
        if self.algorithm.explore is None:  # DiffusionNFT: K seeds, no pool
            seeds = candidate_seeds(self.seed, iteration, slot, keep)
            return Group(prompt, self.regenerate(prompt, seeds), None,
                         Work(fp_sample_steps=self.regen_sampling.sample_steps(keep), scored_images=keep))
        if self.algorithm.regenerate:  # Sol-RL: only (seed, proxy reward) pairs are needed from the pool
            work = Work()
            if ranked is None:
                ranked = self.ranked(iteration, slot, prompt, version, spread_reference)
                work.lp_sample_steps = ranked.sample_steps  # the pool it took (halving, spread: not N · steps)
                work.scored_images = ranked.scored  # an explorer's scoring is counted by the driver
            chosen = self.select(ranked)
            work.fp_sample_steps = self.regen_sampling.sample_steps(len(chosen))
            work.scored_images += len(chosen)
            return Group(prompt, self.regenerate(prompt, [ranked.seeds[i] for i in chosen]), ranked.proxy[chosen],
                         work, ranked.first_spread)
        pool, work = self._pool(iteration, slot, prompt, version)
        chosen = self.select(RankedGroup(iteration, slot, prompt, pool.seeds, pool.rewards, version))
        return Group(prompt, pool.take(chosen), None, work)

    def stream(self, iteration: int, group: RankedGroup, version: int) -> float:
        """Roll one slot out now, from its ranked group, while the other slots are still explored; seconds.
        Deterministic per slot (derived seeds, the current policy), so arrival order changes nothing."""
        start = time.perf_counter()
        self._streamed[group.slot] = (group, self.rollout(iteration, group.slot, group.prompt, version, group))
        seconds = time.perf_counter() - start
        self._streamed_s += seconds
        return seconds

    def collect(self, iteration: int, slots: list[tuple[int, str]], groups: list[RankedGroup] | None,
                version: int, spread_reference: float | None = None) -> tuple[list[Group], list[int], float]:
        """The rollouts of `slots` (slot, prompt): streamed ones where they were made from exactly these
        groups, the others now (ranked here with `spread_reference` when there are no groups). Also the slots
        used from the stream, in arrival order, and its seconds."""
        by_slot = {g.slot: g for g in groups or []}
        streamed = {slot: rollout for slot, (group, rollout) in self._streamed.items()
                    if slot in by_slot and made_from(group, by_slot[slot])}
        used, seconds = list(streamed), self._streamed_s  # dicts keep arrival order
        self._streamed, self._streamed_s = {}, 0.0
        rollouts = [streamed[slot] if slot in streamed else self.rollout(iteration, slot, prompt, version,
                                                                          by_slot.get(slot), spread_reference)
                    for slot, prompt in slots]
        return rollouts, used, seconds
