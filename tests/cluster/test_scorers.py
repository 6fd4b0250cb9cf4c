"""RewardScorer actors as a serving layer: shared batches across callers, one load, restarts re-score."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import ray
import torch
from faults import die_scoring_once

from actors.reward_scorer import RemoteReward, RewardScorer
from diffusion.embedded.data import load_digit_images, prompt_for
from rewards import RewardConfig, build_reward_from_config
from rewards.config import build_reward_components

pytestmark = [pytest.mark.ray]
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

MULTI = RewardConfig(weights={"digit_alignment": 1.0, "jpeg_compressibility": 0.5})


@pytest.fixture(scope="module")
def digits():
    data = load_digit_images("heldout")
    images = data.images[:12].float()
    return images, [prompt_for(int(label)) for label in data.labels[:12]]


def start_scorer(**options):
    return ray.remote(RewardScorer).options(num_cpus=0.25, max_restarts=-1, max_task_retries=-1).remote(
        MULTI, **options)


@ray.remote(num_cpus=0.1)
def caller(scorers, images, prompts):
    return RemoteReward(scorers, MULTI).score_and_details(images, prompts)


def test_callers_share_a_batch_and_get_exactly_their_own_scores(local_ray, digits):
    images, prompts = digits
    scorer = start_scorer(max_batch=64, max_wait_ms=2000.0)
    try:
        halves = [ray.get([caller.remote([scorer], images[:5], prompts[:5]),
                           caller.remote([scorer], images[5:], prompts[5:])])]
        sizes = ray.get(scorer.batch_sizes.remote())
    finally:
        ray.kill(scorer, no_restart=True)
    assert sizes == [12]  # both callers' images in one batch, closed by the 2 s deadline
    (first, first_details), (second, second_details) = halves[0]
    local, local_details = build_reward_from_config(MULTI).score_and_details(images, prompts)
    torch.testing.assert_close(torch.cat([first, second]), local, rtol=1e-6, atol=1e-6)
    for name in ("digit_alignment", "jpeg_compressibility", "digit_alignment/accuracy", "jpeg_compressibility/jpeg_kb"):
        torch.testing.assert_close(torch.cat([first_details[name], second_details[name]]), local_details[name],
                                   rtol=1e-6, atol=1e-6)
    expected = first_details["digit_alignment"] + 0.5 * first_details["jpeg_compressibility"]
    torch.testing.assert_close(first, expected)


def test_a_full_batch_does_not_wait_for_the_deadline(local_ray, digits):
    images, prompts = digits
    scorer = start_scorer(max_batch=4, max_wait_ms=600_000.0)
    try:
        scores = RemoteReward([scorer], MULTI)(images[:4], prompts[:4])
        assert ray.get(scorer.batch_sizes.remote()) == [4]
    finally:
        ray.kill(scorer, no_restart=True)
    assert scores.shape == (4,)


def test_a_scorer_killed_mid_batch_restarts_and_rescores_to_the_same_values(local_ray, digits):
    images, prompts = digits
    scorer = start_scorer(max_batch=64, max_wait_ms=0.0)
    try:
        before = RemoteReward([scorer], MULTI).score_and_details(images, prompts)
        pid = ray.get(scorer.__ray_call__.remote(lambda s: __import__("os").getpid()))
        ray.get(scorer.__ray_call__.remote(die_scoring_once))
        after = RemoteReward([scorer], MULTI).score_and_details(images, prompts)  # dies, restarts, retried
        new_pid = ray.get(scorer.__ray_call__.remote(lambda s: __import__("os").getpid()))
        sizes = ray.get(scorer.batch_sizes.remote())
    finally:
        ray.kill(scorer, no_restart=True)
    assert new_pid != pid and sizes == [12]  # a fresh process scored the retried batch
    assert torch.equal(before[0], after[0])
    assert before[1].keys() == after[1].keys() and all(torch.equal(before[1][k], after[1][k]) for k in before[1])


def test_each_scorer_loads_every_component_once(local_ray):
    scorer = start_scorer()
    try:
        names = ray.get(scorer.__ray_call__.remote(lambda s: sorted(s.rewards)))
    finally:
        ray.kill(scorer, no_restart=True)
    assert names == sorted(build_reward_components(MULTI)) == ["digit_alignment", "jpeg_compressibility"]


def test_score_components_keeps_image_shapes_apart():
    from actors.reward_scorer import score_components

    rewards = build_reward_components(RewardConfig(weights={"jpeg_compressibility": 1.0}))
    rng = np.random.default_rng(0)
    small = rng.random((3, 3, 16, 16), dtype=np.float32)
    large = rng.random((2, 3, 32, 32), dtype=np.float32)
    results = score_components(rewards, [(small, ["a"] * 3, [{}] * 3), (large, ["b"] * 2, [{}] * 2),
                                         (small[:1], ["c"], [{}])])
    for result, images in zip(results, (small, large, small[:1]), strict=True):
        alone = rewards["jpeg_compressibility"](torch.from_numpy(images), ["x"] * len(images))
        assert torch.equal(result["jpeg_compressibility"][0], alone)


JPEG = RewardConfig(weights={"jpeg_compressibility": 1.0})


@pytest.mark.parametrize("config", [JPEG, MULTI], ids=["uint8", "float32"])
def test_images_travel_as_uint8_exactly_when_every_reward_reads_8_bits(local_ray, digits, config):
    """jpeg_compressibility alone: uint8, one byte a value; with digit_alignment (which reads the floats):
    float32, four. Either way the scores and details are bitwise those of the rewards in process."""
    images, prompts = digits
    images = images + 0.3 / 255 * torch.randn(images.shape, generator=torch.Generator().manual_seed(1))  # off grid
    scorer = ray.remote(RewardScorer).options(num_cpus=0.25).remote(config, max_batch=64, max_wait_ms=0.0)
    try:
        remote = RemoteReward([scorer], config)
        scores, details = remote.score_and_details(images, prompts)
        received = ray.get(scorer.received.remote())
    finally:
        ray.kill(scorer, no_restart=True)
    uint8 = config is JPEG
    assert remote.uint8 == uint8 and remote.payload(images).dtype == (np.uint8 if uint8 else np.float32)
    assert received == ({"uint8": 12 * 16 * 16} if uint8 else {"float32": 12 * 16 * 16 * 4})
    local, local_details = build_reward_from_config(config).score_and_details(images, prompts)
    assert torch.equal(scores, local)
    assert details.keys() == local_details.keys() and all(torch.equal(details[k], local_details[k]) for k in details)


def test_a_scorer_refuses_uint8_images_for_a_reward_that_reads_floats(digits):
    from actors.reward_scorer import score_components
    from rewards.uint8_images import image_payload

    images, prompts = digits
    with pytest.raises(ValueError, match="uint8 images for digit_alignment, which read float pixels"):
        score_components(build_reward_components(MULTI), [(image_payload(images, True), prompts, [{}] * 12)])


@pytest.mark.usefixtures("no_leftover_actors")
def test_a_job_whose_scorer_receives_uint8_images_trains_the_single_process_weights(local_ray, tmp_path):
    """The JPEG reward through a scorer actor: explorers and the learner send uint8 images, and the weights
    are bitwise those of scoring the float images in process."""
    from jobs import assert_same, run_job, single_process
    from tiny import tiny_config

    jpeg = "reward.weights={jpeg_compressibility: 1.0}"
    received = []
    weights, _ = run_job(tiny_config(jpeg, "cluster.scorers.count=1", "cluster.scorers.num_cpus=0.25", ray=True),
                         tmp_path / "uint8", on_iteration=lambda job, _: received.append(
                             ray.get(job.scorers[0].received.remote())))
    assert [set(r) for r in received] == [{"uint8"}, {"uint8"}] and received[1]["uint8"] > received[0]["uint8"] > 0
    assert_same(weights, single_process(tiny_config(jpeg, ray=True)))
