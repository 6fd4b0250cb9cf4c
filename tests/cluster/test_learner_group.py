"""A learner group (cluster.learner.count = 2) on a real local Ray: two learner actors in one gloo process
group, each regenerating and training on its own slots, gradients summed by torch.distributed."""

from __future__ import annotations

import pytest
from jobs import assert_same, single_process
from tiny import tiny_config

# In the three-host tests' pytest-xdist group: they compare their job with this one's run (`learner_group_run`).
pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("no_leftover_actors"), pytest.mark.xdist_group("three_hosts")]

# L = 2 sums each gradient from two per-rank partial sums and runs forwards on half the batch: fp32 rounding
# of the gradient moves each AdamW step by a few ulp of lr; after three updates the measured gap is 1.5e-8.
TOLERANCE = 1e-6


def test_a_learner_group_trains_like_one_learner_and_survives_a_killed_rank(local_ray, learner_group_run):
    """Rank 1 is SIGKILLed inside iteration 1's update: the job ends at once naming it (rank 0 waits in the
    all-reduce), with iteration 0's checkpoint; the resumed group ends within fp32 rounding of one learner,
    every rank holding the same weights bit for bit."""
    run = learner_group_run()
    assert run["error"].startswith("learner rank 1 of 2 died in train"), run["error"]
    assert [m["iteration"] for m in run["first"]] == [0]
    assert run["checkpoint"] == 1
    assert [m["iteration"] for m in run["history"]] == [1, 2]
    assert_same(run["ranks"][0], run["ranks"][1])

    reference = single_process(tiny_config("run.iterations=3", ray=True))
    weights = run["weights"]
    assert weights.keys() == reference.keys()
    worst = max(float((weights[k] - reference[k]).abs().max()) for k in weights)
    print(f"L=2 vs L=1: largest weight difference {worst:.3e}")
    assert worst <= TOLERANCE
    # every slot regenerated exactly once, by its own rank: 2 slots × keep 4 × 3 sampler steps per iteration
    history = run["first"] + run["history"]
    assert [m["fp_sample_steps"] for m in history] == [24, 24, 24]
    assert [m["policy_version"] for m in history] == [1, 2, 3]
    assert all(m["streamed_slots"] == [0] for m in history)  # rank 0 owns slot 0, rank 1 slot 1
