"""The `scored_images` counter on a real tiny iteration of each kind: it counts every image the reward scores
(checked against the reward's own calls), the backfill of old run files gives the same count from the step
counters, and a pool ranked by explorer actors is counted by the driver as the learner counts its own."""

from __future__ import annotations

import pytest

from bench.convergence import backfill_scored_images

# The tiny scale (tests/tiny.py): P = 2 prompts, N = 8 candidates, K = 4 kept, 4 sampler steps, 3 explore steps.
KINDS = {
    "diffusionnft": (["learner.algorithm=diffusionnft"], 2 * 4),  # K-in-K: K images
    "flow_grpo": (["learner.algorithm=diffusionnft", "learner.objective=flow_grpo", "learner.decay.type=0",
                   "learner.timestep_fraction=0.9"], 2 * 4),  # K-in-K on the flow_sde solver
    "naive_scaling": (["learner.algorithm=naive_scaling"], 2 * 8),  # the pool of N, trained on
    "naive_quant": (["learner.algorithm=naive_quant"], 2 * 8),
    "sol_rl": (["learner.algorithm=sol_rl"], 2 * (8 + 4)),  # the pool of N, then the K regenerated
    # every seed scored at the cut after 1 step, the 4 survivors again at the end, then the K regenerated
    "sol_rl_halving": (["learner.algorithm=sol_rl", "explore.schedule=halving", "explore.halving_steps=1",
                        "explore.halving_survivors=4"], 2 * (8 + 4 + 4)),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_counter_counts_every_scored_image_and_the_backfill_agrees(small_trainer, monkeypatch, kind) -> None:
    sets, expected = KINDS[kind]
    trainer = small_trainer(*sets)
    scored = []
    score = trainer.reward.score_and_details

    def counting(images, *args, **kwargs):
        scored.append(len(images))
        return score(images, *args, **kwargs)

    monkeypatch.setattr(trainer.reward, "score_and_details", counting)
    metrics = trainer.train_iteration(0).metrics()
    assert metrics["scored_images"] == sum(scored) == expected
    assert backfill_scored_images(metrics, trainer.config) == metrics["scored_images"]


def test_an_explorers_scoring_is_counted_by_the_driver_as_the_learner_counts_its_own(small_trainer) -> None:
    """A cluster iteration's record adds the explorers' work (`explorer_work` over their ranked groups) to
    the learners': together the single-process iteration's counters."""
    from cluster.runtime.driver import explorer_work

    local = small_trainer().train_iteration(0).metrics()
    trainer = small_trainer()
    groups = [trainer.rollouts.ranked(0, slot, prompt, trainer.version)
              for slot, prompt in enumerate(trainer.prompts_for(0))]
    learner, explorers = trainer.train_iteration(0, groups).metrics(), explorer_work(groups)
    assert (learner["scored_images"], explorers.scored_images) == (2 * 4, 2 * 8)
    assert learner["scored_images"] + explorers.scored_images == local["scored_images"]
    assert learner["lp_sample_steps"] + explorers.lp_sample_steps == local["lp_sample_steps"] == 2 * 8 * 3
