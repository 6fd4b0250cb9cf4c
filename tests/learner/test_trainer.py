"""The single-process trainer on the embedded model, at a tiny scale: algorithms, resume, faults."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest
import torch

from learner.trainer import Trainer
from rewards.base import Reward, register_reward


def theta(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.state.theta_parameters().items()}


@pytest.mark.parametrize(
    ("algorithm", "fp_steps", "pool_steps", "lp_steps"),
    [
        ("diffusionnft", 2 * 4 * 4, 0, 0),  # K samples at full precision
        ("naive_scaling", 0, 2 * 8 * 4, 0),  # a pool of N at full precision
        ("naive_quant", 0, 0, 2 * 8 * 4),  # N at low precision, train steps
        ("sol_rl", 2 * 4 * 4, 0, 2 * 8 * 3),  # N at low precision, explore steps + K regenerated
    ],
)
def test_algorithms_sample_what_the_paper_says(algorithm, fp_steps, pool_steps, lp_steps, small_trainer):
    trainer = small_trainer(f"learner.algorithm={algorithm}")
    before = theta(trainer)
    metrics = trainer.train_iteration(0).metrics()
    assert (metrics["fp_sample_steps"], metrics["fp_pool_sample_steps"], metrics["lp_sample_steps"]) == (
        fp_steps, pool_steps, lp_steps)
    # P·K samples × ⌊0.6·4⌋ = 2 trained timesteps × (θ forward + backward 3, θ_old 1, reference 1)
    assert metrics["train_passes"] == 2 * 4 * 2 * 5
    assert trainer.version == 1 and not metrics.get("skipped")
    assert any(not torch.equal(before[k], v) for k, v in theta(trainer).items()), "θ must move"
    assert ("rank_spearman" in metrics) == (algorithm == "sol_rl")


@pytest.mark.parametrize("algorithm", ["diffusionnft", "naive_scaling", "sol_rl"])
def test_a_guided_sample_step_counts_its_two_forwards(algorithm, small_trainer):
    """Under CFG every sampling step runs the transformer on the sample and on the negative prompt: the work the
    cost model prices doubles (regeneration, pools and exploration alike), the scored images do not."""
    counters = ("fp_sample_steps", "fp_pool_sample_steps", "lp_sample_steps", "scored_images")
    plain, guided = ({k: small_trainer(f"learner.algorithm={algorithm}", f"sampler.cfg_scale={scale}")
                      .train_iteration(0).metrics()[k] for k in counters} for scale in (1.0, 2.0))
    assert any(plain[k] for k in counters[:3])
    assert {k: guided[k] for k in counters[:3]} == {k: 2 * plain[k] for k in counters[:3]}
    assert guided["scored_images"] == plain["scored_images"]


def test_engine_receives_the_sampling_policy_when_published(small_trainer):
    trainer = small_trainer()
    trainer.train_iteration(0)
    with pytest.raises(RuntimeError, match="call publish"):  # a stale engine is refused, never used
        trainer.train_iteration(1)
    trainer.publish()
    published = trainer.state.sampling_weights()
    engine_state = trainer.engine.module.state_dict()
    assert published.keys() <= engine_state.keys()
    assert all(torch.equal(engine_state[k], v) for k, v in published.items())


# spread: the pools of iteration i depend on iteration i − 1's (the reference a checkpoint carries); with 3 slots
# the first resumed iteration mixes pools of 6 and 8, which a resume without the reference would not. The fixed
# schedule's resume (no reference) is each family's, tests/learner/test_export.py.
SPREAD_3 = ("explore.schedule=spread", "explore.spread_first=6", "prompts.per_iteration=3")


def test_a_spread_run_resumes_bitwise(tmp_path, small_trainer):
    """Iteration 1, the first after the resume, is the one whose pools the restored reference decides."""
    sets = SPREAD_3
    straight = small_trainer(*sets, run_dir=tmp_path / "a")
    straight.run(2, log=lambda _: None)

    first = small_trainer(*sets, run_dir=tmp_path / "b")
    first.run(1, log=lambda _: None)
    resumed = small_trainer(*sets, run_dir=tmp_path / "b")
    resumed.resume()
    assert resumed.iteration == 1 and resumed.version == 1
    assert resumed.spread_reference == first.spread_reference is not None
    resumed.run(2, log=lambda _: None)
    # a slot took only its first chunk right after the resume: the restored reference decided it
    assert [m["lp_sample_steps"] for m in straight.history] == [m["lp_sample_steps"] for m in resumed.history]
    assert resumed.history[1]["lp_sample_steps"] < 3 * 8 * 3
    a, b = theta(straight), theta(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    old_a, old_b = straight.state.old_parameters(), resumed.state.old_parameters()
    assert all(torch.equal(old_a[k], old_b[k]) for k in old_a)
    # the resumed trainer's history is the whole run's: iteration 0 comes back from metrics.jsonl
    assert [m["iteration"] for m in resumed.history] == [0, 1]
    assert [m["reward_mean"] for m in straight.history] == [m["reward_mean"] for m in resumed.history]


@register_reward("nan_for_tests")
class NaNReward(Reward):
    """A reward that breaks: NaN for every sample (tests the skip path)."""

    name = "nan_for_tests"

    def _compute(self, images, prompts, metadata):
        return torch.full((images.shape[0],), float("nan")), {}


def test_nan_rewards_skip_the_update_and_publish_nothing(small_trainer):
    trainer = small_trainer("reward.weights={nan_for_tests: 1.0}")
    before, engine_before = theta(trainer), {k: v.clone() for k, v in trainer.engine.module.state_dict().items()}
    metrics = trainer.train_iteration(0).metrics()
    trainer.publish()
    assert metrics["skipped"] and trainer.state.skipped_steps == 1 and trainer.version == 0
    assert all(torch.equal(before[k], v) for k, v in theta(trainer).items())
    assert all(torch.equal(engine_before[k], v) for k, v in trainer.engine.module.state_dict().items())


def test_shuffled_rewards_keep_each_prompts_reward_multiset(small_trainer):
    plain, shuffled = small_trainer(), small_trainer("learner.shuffle_rewards=true")
    groups = [plain.rollout(0, slot, p) for slot, p in enumerate(plain.prompts_for(0))]
    a = plain.updater.rewards_for_update(0, groups)
    b = shuffled.updater.rewards_for_update(0, groups)
    assert not torch.equal(a, b)
    assert torch.equal(a.sort(dim=1).values, b.sort(dim=1).values)


def test_art_objective_runs_both_windows(small_trainer):
    trainer = small_trainer("learner.objective=art", "learner.decay.type=0", "learner.algorithm=diffusionnft")
    before = theta(trainer)
    metrics = trainer.train_iteration(0).metrics()
    assert {"window1_loss", "window2_loss", "window1_grad_norm", "window2_grad_norm"} <= metrics.keys()
    assert any(not torch.equal(before[k], v) for k, v in theta(trainer).items())
    # decay type 0: the sampling policy is the trained one after the update
    old = trainer.state.old_parameters()
    assert all(torch.equal(old[k], v) for k, v in theta(trainer).items())


def test_evaluation_is_deterministic(small_trainer):
    trainer = small_trainer()
    assert trainer.evaluate() == trainer.evaluate()


@register_reward("metadata_echo_for_tests")
class MetadataEcho(Reward):
    """Scores each image with its prompt's metadata field `value`, and records what it was given."""

    name = "metadata_echo_for_tests"
    seen: ClassVar[list[tuple[str, dict]]] = []

    def _compute(self, images, prompts, metadata):
        MetadataEcho.seen.extend(zip(prompts, metadata, strict=True))
        return torch.tensor([float(m["value"]) for m in metadata]), {}


def test_each_prompts_jsonl_metadata_reaches_the_reward_in_every_phase(small_trainer, tmp_path):
    from diffusion.embedded.data import heldout_prompts, train_prompts

    values = {}
    for name, texts in (("train", train_prompts()), ("heldout", heldout_prompts())):
        lines = []
        for i, text in enumerate(texts):
            values[text] = 100 * (name == "heldout") + i
            lines.append(json.dumps({"prompt": text, "value": values[text], "tag": name}))
        (tmp_path / f"{name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    trainer = small_trainer(f"prompts.source={tmp_path / 'train.jsonl'}",
                            f"prompts.eval_source={tmp_path / 'heldout.jsonl'}",
                            "reward.weights={metadata_echo_for_tests: 1.0}")
    MetadataEcho.seen.clear()
    metrics = trainer.train_iteration(0).metrics()
    explored = len(MetadataEcho.seen)
    assert explored > 0 and all(m == {"value": values[p], "tag": "train"} for p, m in MetadataEcho.seen)
    # the rewards the update saw are the metadata values of the iteration's prompts, per slot
    expected = torch.tensor([float(values[p]) for p in trainer.prompts_for(0)])
    assert metrics["reward_mean"] == pytest.approx(float(expected.mean()))
    trainer.evaluate()
    held = MetadataEcho.seen[explored:]
    assert held and all(m == {"value": values[p], "tag": "heldout"} for p, m in held)


def test_evaluation_reports_the_other_rewards_its_reward_scores_alongside(small_trainer):
    """Training on digit_margin, the held-out evaluation also reports digit_alignment and accuracy of the
    same samples: what issue 12 compares the algorithms on."""
    margin = small_trainer("reward.weights={digit_margin: 1.0}", "eval.prompts=1").evaluate()
    alignment = small_trainer("eval.prompts=1").evaluate()
    assert set(margin) == {"eval_reward", "eval_accuracy", "eval_digit_alignment"}
    assert margin["eval_digit_alignment"] == pytest.approx(alignment["eval_reward"], abs=1e-6)
    assert margin["eval_accuracy"] == alignment["eval_accuracy"]
    assert margin["eval_reward"] > margin["eval_digit_alignment"]  # log-odds > log p


def test_sol_rl_keeping_its_whole_pool_trains_exactly_as_diffusionnft(small_trainer):
    """With N = K, best-worst selection keeps every seed and regenerates them at full precision: the
    exploration then only costs, and θ must follow DiffusionNFT's bitwise (the evidence suite's
    sol_rl_pool24 run reproduces diffusionnft's held-out curve to the last digit)."""
    nft = small_trainer("learner.algorithm=diffusionnft")
    sol = small_trainer("learner.algorithm=sol_rl", f"prompts.candidates={nft.config.prompts.keep}")
    for iteration in range(2):
        metrics = [t.train_iteration(iteration).metrics() for t in (nft, sol)]
        nft.publish(), sol.publish()
        assert metrics[1]["lp_sample_steps"] > 0 and metrics[0]["lp_sample_steps"] == 0
    a, b = theta(nft), theta(sol)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
