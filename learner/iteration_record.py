"""What one iteration produces, typed: the update's result, the counted work, and the run's record of it.

    Work          sample-steps and model passes spent, carried by each rollout and by the update
    TrainResult   what `train` returns on every learner rank: the policy version after the update,
                  this rank's work, scores, losses and timings
    Published     what publishing θ_old cost
    Finished      what closing an iteration added on rank 0: the held-out evaluation (and its grid)
    IterationRecord  the driver's record: everything above plus the explorers' numbers; its `row()`
                  is the metrics.jsonl line, the progress line's and the dashboard's source

The record is assembled once, by whoever drives the loop (`cluster.runtime.driver` or
`learner.trainer.Trainer.run`), and written once (`learner.run_log.RunLog`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from learner.experiment_log import GridSamples


@dataclass
class Work:
    """Work an iteration counts; `bench.convergence` prices each at the paper's Table 5 rates (`bench.prices`):
    sample-steps (one sample through one forward: a guided step counts twice, `Sampling.sample_steps`) of the
    kept samples in full precision, of a pool in full or low precision, training's
    per-sample model passes (`learner.updates.UpdateContext.passes`), and the images decoded and scored by
    the reward in any pass (pools, successive halving's cut and its survivors, regeneration, K-in-K
    rollouts; not held-out evaluation), each once however many steps made it."""

    fp_sample_steps: int = 0
    fp_pool_sample_steps: int = 0
    lp_sample_steps: int = 0
    train_passes: int = 0
    scored_images: int = 0

    def __add__(self, other: Work) -> Work:
        return Work(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(Work)))

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


COUNTED_WORK = tuple(f.name for f in fields(Work))


@dataclass
class TrainResult:
    """One learner rank's update: scores are the whole batch's (every rank sees them), work is this rank's."""

    iteration: int
    version: int  # the policy version after the update (unchanged when it was skipped)
    sampled_with_version: int  # the policy that regenerated the kept samples (the current one)
    skipped: bool
    work: Work
    scores: dict[str, float]  # reward_mean, reward_max, reward_<name>, accuracy, rank fidelity
    losses: dict[str, float]  # the objective's numbers (loss, grad_norm, …)
    rollout_s: float
    train_s: float
    iteration_s: float
    proxy_reward_mean: float | None = None  # the explorers' proxies of the whole pool
    streamed_slots: list[int] | None = None  # regenerated as they arrived, in that order (None: not streamed)
    streamed_rollout_s: float = 0.0
    step_s: dict[str, float] = field(default_factory=dict)  # explore_step_s / regen_step_s measured on this rank

    def metrics(self, work: Work | None = None) -> dict[str, Any]:
        """The update's part of the metrics.jsonl line, with `work` (default: this rank's)."""
        row: dict[str, Any] = {"iteration": self.iteration, "policy_version": self.version,
                               "sampled_with_version": self.sampled_with_version, **self.scores, **self.losses}
        if self.skipped:
            row["skipped"] = True
        row.update(rollout_s=self.rollout_s, train_s=self.train_s, iteration_s=self.iteration_s,
                   **(work or self.work).as_dict(), **self.step_s)
        if self.streamed_slots is not None:  # a learner actor's: the pool came from explorers
            row.update(proxy_reward_mean=self.proxy_reward_mean, streamed_slots=self.streamed_slots,
                       streamed_rollout_s=self.streamed_rollout_s)
        return row


@dataclass
class Published:
    version: int
    sync_s: float
    sync_bytes: float = 0.0  # bytes sent: one copy to each node's weight-sync service


@dataclass
class Finished:
    evaluation: dict[str, float]  # eval_* when an evaluation was due, else empty
    grid: GridSamples | None = None  # the held-out grid of that evaluation, when an experiment log wants it
    learner_idle_fraction: float | None = None  # waiting for explorers, of the time since the last update


@dataclass
class IterationRecord:
    """One iteration as the driver saw it; `row()` flattens it into the metrics.jsonl line."""

    train: TrainResult
    work: Work  # the learner group's (every rank's work summed) and the explorers' (their ranked groups')
    published: Published
    finished: Finished
    skipped_updates: int  # the run's so far, this one included
    explore: dict[str, float] = field(default_factory=dict)  # the explorers' numbers (explore_s, retries, …)
    iteration_wall_s: float = 0.0  # dispatch → finished

    @property
    def iteration(self) -> int:
        return self.train.iteration

    def row(self) -> dict[str, Any]:
        row = self.train.metrics(self.work)
        row.update(skipped_updates=self.skipped_updates, **self.explore, sync_s=self.published.sync_s,
                   sync_bytes=self.published.sync_bytes, **self.finished.evaluation)
        if self.finished.learner_idle_fraction is not None:
            row["learner_idle_fraction"] = self.finished.learner_idle_fraction
        row["iteration_wall_s"] = self.iteration_wall_s
        if row.get("explore_step_s") and row.get("regen_step_s"):
            # Sol-RL pays only while a low-precision step costs less than a full-precision one (0.46 in the paper).
            row["explore_regen_step_ratio"] = row["explore_step_s"] / row["regen_step_s"]
        return row
