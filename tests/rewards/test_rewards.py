"""Rewards: the interface, digit_alignment on real held-out digits, JPEG size, weighted sums, config."""

from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image
from pydantic import ValidationError
from scorer_path import assert_scorer_path_is_exact, off_grid

from diffusion.embedded.data import DIGIT_WORDS, load_digit_images, prompt_for
from rewards import (
    DigitAlignment,
    JpegCompressibility,
    RewardConfig,
    WeightedSum,
    build_reward,
    build_reward_from_config,
    known_rewards,
)
from rewards.digit_classifier import DEFAULT_DIR, load_classifier, save_classifier
from rewards.train_digit_classifier import train


@pytest.fixture(scope="module")
def alignment() -> DigitAlignment:
    return build_reward("digit_alignment")


@pytest.fixture(scope="module")
def heldout():
    return load_digit_images("heldout")


def prompts_for(labels: torch.Tensor) -> list[str]:
    return [prompt_for(int(label)) for label in labels]


def test_registry_knows_both_rewards_and_rejects_unknown_names_listing_them():
    assert {"digit_alignment", "jpeg_compressibility"} <= set(known_rewards())
    with pytest.raises(ValueError, match="unknown reward 'no_such_reward'") as error:
        build_reward("no_such_reward")
    for name in known_rewards():
        assert name in str(error.value)


@pytest.mark.parametrize("name", ["digit_alignment", "jpeg_compressibility"])
def test_every_reward_returns_finite_float32_per_sample_on_cpu(name, heldout):
    reward = build_reward(name)
    images = heldout.images[:6]
    scores = reward(images, prompts_for(heldout.labels[:6]))
    assert scores.dtype == torch.float32
    assert scores.shape == (6,)
    assert scores.device.type == "cpu"
    assert torch.isfinite(scores).all()
    assert reward.name == name


def test_returned_scores_are_ordinary_tensors_the_caller_may_modify(alignment, heldout):
    scores = alignment(heldout.images[:4], prompts_for(heldout.labels[:4]))
    accuracy = alignment.details(heldout.images[:4], prompts_for(heldout.labels[:4]))["accuracy"]
    scores -= scores.mean()  # in place: fails on inference-mode tensors
    accuracy *= 2
    assert not scores.is_inference() and not accuracy.is_inference()


def test_digit_alignment_is_a_log_probability(alignment, heldout):
    scores = alignment(heldout.images, prompts_for(heldout.labels))
    assert (scores <= 0).all()
    probs = alignment.details(heldout.images, prompts_for(heldout.labels))["prob"]
    torch.testing.assert_close(probs, scores.exp())


def test_correct_prompt_outscores_every_wrong_prompt_on_heldout_digits(alignment, heldout):
    n = len(heldout.labels)
    per_digit = torch.stack([alignment(heldout.images, [prompt_for(d)] * n) for d in range(10)], dim=1)
    correct = per_digit.gather(1, heldout.labels[:, None]).squeeze(1)
    wrong = per_digit.masked_fill(torch.nn.functional.one_hot(heldout.labels, 10).bool(), -torch.inf)
    assert (correct > wrong.max(dim=1).values).float().mean() >= 0.95


def test_details_accuracy_is_classifier_argmax_equals_prompted_digit(alignment, heldout):
    accuracy = alignment.details(heldout.images, prompts_for(heldout.labels))["accuracy"]
    with torch.inference_mode():
        predicted = load_classifier()(heldout.images).argmax(dim=1)
    torch.testing.assert_close(accuracy, (predicted == heldout.labels).float())
    assert accuracy.mean() >= 0.97
    # A wrong prompt flips it: the classifier still predicts the real digit.
    shifted = prompts_for((heldout.labels + 1) % 10)
    assert alignment.details(heldout.images, shifted)["accuracy"].mean() <= 0.03


def test_a_real_seven_scores_higher_as_seven_than_as_one(alignment, heldout):
    sevens = heldout.images[heldout.labels == 7]
    as_seven = alignment(sevens, ["a handwritten digit seven"] * len(sevens))
    as_one = alignment(sevens, ["a handwritten digit one"] * len(sevens))
    assert as_seven[0] > as_one[0]
    assert (as_seven > as_one).all()


def test_noise_and_blank_images_score_below_real_digits_of_the_prompted_class(alignment, heldout):
    prompts = prompts_for(heldout.labels)
    real = alignment(heldout.images, prompts).mean()
    noise = torch.rand(heldout.images.shape, generator=torch.Generator().manual_seed(0))
    assert alignment(noise, prompts).mean() < real - 1.0
    assert alignment(torch.zeros_like(heldout.images), prompts).mean() < real - 1.0


def test_rgb_input_equals_grey_replicated(alignment, heldout):
    grey, prompts = heldout.images[:32], prompts_for(heldout.labels[:32])
    torch.testing.assert_close(alignment(grey.expand(-1, 3, -1, -1), prompts), alignment(grey, prompts))


def test_larger_inputs_are_resized(alignment, heldout):
    big = torch.nn.functional.interpolate(heldout.images[:64], size=(48, 48), mode="bilinear").clamp(0, 1)
    details = alignment.details(big, prompts_for(heldout.labels[:64]))
    assert details["accuracy"].mean() >= 0.95


@pytest.mark.parametrize("name", ["digit_alignment", "jpeg_compressibility"])
def test_batch_order_invariance_is_exact(name, heldout):
    reward = build_reward(name)
    images, prompts = heldout.images[:40], prompts_for(heldout.labels[:40])
    perm = torch.randperm(40, generator=torch.Generator().manual_seed(1))
    assert torch.equal(reward(images[perm], [prompts[i] for i in perm]), reward(images, prompts)[perm])


def test_batching_inside_the_reward_does_not_change_scores(heldout):
    prompts = prompts_for(heldout.labels[:50])
    small = DigitAlignment(batch_size=7)(heldout.images[:50], prompts)
    torch.testing.assert_close(small, DigitAlignment()(heldout.images[:50], prompts))


@pytest.mark.parametrize(
    ("images", "prompts", "message"),
    [
        (torch.full((2, 1, 16, 16), 1.6), ["a handwritten digit one"] * 2, r"\[0, 1\]"),
        (torch.full((2, 1, 16, 16), -0.5), ["a handwritten digit one"] * 2, r"\[0, 1\]"),
        (torch.zeros(1, 16, 16), ["a handwritten digit one"], "rank 4"),
        (torch.zeros(2, 2, 16, 16), ["a handwritten digit one"] * 2, "channels"),
        (torch.zeros(3, 1, 16, 16), ["a handwritten digit one"] * 2, "3 images but 2 prompts"),
        (torch.zeros(2, 1, 16, 16, dtype=torch.uint8), ["a handwritten digit one"] * 2, "float"),
        (torch.full((1, 1, 16, 16), torch.nan), ["a handwritten digit one"], "NaN"),
        (torch.zeros(1, 1, 16, 16), "a handwritten digit one", "sequence of strings"),
    ],
)
@pytest.mark.parametrize("name", ["digit_alignment", "jpeg_compressibility"])
def test_bad_inputs_raise_value_error_naming_the_problem(name, images, prompts, message):
    with pytest.raises(ValueError, match=message):
        build_reward(name)(images, prompts)


def test_prompt_naming_no_digit_raises(alignment):
    prompts = ["a handwritten digit one", "a picture of a cat"]
    with pytest.raises(ValueError, match=r"prompt 1: .*'a picture of a cat'.*found none"):
        alignment(torch.zeros(2, 1, 16, 16), prompts)


def test_small_rounding_outside_the_range_is_tolerated(alignment, heldout):
    images, prompts = heldout.images[:4], prompts_for(heldout.labels[:4])
    nudged = images * 1.004 - 0.002
    torch.testing.assert_close(alignment(nudged, prompts), alignment(nudged.clamp(0, 1), prompts))


def test_missing_weights_file_raises_file_not_found_naming_it_and_the_rebuild_command(tmp_path):
    folder = tmp_path / "classifier"
    shutil.copytree(DEFAULT_DIR, folder)
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors.*rewards\.train_digit_classifier"):
        build_reward("digit_alignment", path=folder)


def test_committed_artifact_is_small_and_its_metrics_pass_the_bar():
    assert sum(f.stat().st_size for f in DEFAULT_DIR.iterdir()) < 1_000_000
    metrics = json.loads((DEFAULT_DIR / "metrics.json").read_text())
    assert metrics["heldout_accuracy"] >= 0.97
    assert metrics["parameters"] <= 100_000
    assert metrics["command"].startswith("python -m rewards.train_digit_classifier")


def test_training_is_deterministic_and_save_load_round_trips(tmp_path, heldout):
    threads = torch.get_num_threads()
    model_a, metrics = train(steps=15, seed=3, batch_size=32)
    assert torch.get_num_threads() == threads  # the global setting is restored
    model_b, _ = train(steps=15, seed=3, batch_size=32)
    for (name, a), b in zip(model_a.state_dict().items(), model_b.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert metrics["steps"] == 15 and metrics["seed"] == 3
    save_classifier(model_a, tmp_path)
    loaded = load_classifier(tmp_path)
    with torch.inference_mode():
        assert torch.equal(loaded(heldout.images[:8]), model_a(heldout.images[:8]))
    prompts = prompts_for(heldout.labels[:8])
    torch.testing.assert_close(
        build_reward("digit_alignment", path=tmp_path)(heldout.images[:8], prompts),
        torch.log_softmax(model_a(heldout.images[:8]), dim=1).gather(1, heldout.labels[:8, None]).squeeze(1),
    )


def direct_jpeg_reward(image: torch.Tensor) -> float:
    """The DDPO definition computed by hand: −len(JPEG bytes at quality 95) / 1000 / 500."""
    array = (image.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    pil = Image.fromarray(array[:, :, 0] if array.shape[2] == 1 else array)
    assert pil.mode == ("L" if array.shape[2] == 1 else "RGB")
    buffer = io.BytesIO()
    pil.save(buffer, format="JPEG", quality=95)
    return -len(buffer.getvalue()) / 1000 / 500


@pytest.mark.parametrize("channels", [1, 3])
def test_jpeg_constant_beats_noise_and_matches_the_direct_computation(channels):
    reward = JpegCompressibility()
    noise = torch.rand(1, channels, 64, 64, generator=torch.Generator().manual_seed(0))
    constant = torch.full((1, channels, 64, 64), 0.5)
    images = torch.cat([constant, noise])
    scores = reward(images, ["a handwritten digit one"] * 2)
    assert scores[0] > scores[1]
    expected = torch.tensor([direct_jpeg_reward(image) for image in images], dtype=torch.float32)
    torch.testing.assert_close(scores, expected, rtol=0, atol=0)
    kb = reward.details(images, ["x"] * 2)["jpeg_kb"]
    torch.testing.assert_close(-kb / 500, scores)


def test_jpeg_saves_grey_as_mode_l_and_colour_as_rgb():
    from rewards.jpeg_compressibility import to_pil

    assert to_pil(torch.zeros(1, 8, 8)).mode == "L"
    assert to_pil(torch.zeros(3, 8, 8)).mode == "RGB"
    assert np.asarray(to_pil(torch.full((1, 2, 2), 0.5))).tolist() == [[128, 128], [128, 128]]


def test_weighted_sum_equals_the_hand_computation(alignment, heldout):
    jpeg = JpegCompressibility()
    images, prompts = heldout.images[:12], prompts_for(heldout.labels[:12])
    combined = WeightedSum(
        {"digit_alignment": alignment, "jpeg": jpeg}, {"digit_alignment": 0.7, "jpeg": 3.0}
    )
    expected = 0.7 * alignment(images, prompts) + 3.0 * jpeg(images, prompts)
    torch.testing.assert_close(combined(images, prompts), expected)
    details = combined.details(images, prompts)
    assert set(details) == {
        "digit_alignment",
        "digit_alignment/accuracy",
        "digit_alignment/predicted_digit",
        "digit_alignment/prob",
        "jpeg",
        "jpeg/jpeg_kb",
    }
    torch.testing.assert_close(details["jpeg"], jpeg(images, prompts))
    torch.testing.assert_close(
        details["digit_alignment/accuracy"], alignment.details(images, prompts)["accuracy"]
    )


@pytest.mark.parametrize(
    ("rewards", "weights", "message"),
    [
        ({}, {}, "at least one reward"),
        ({"j": JpegCompressibility()}, {"j": -1.0}, "non-negative"),
        ({"j": JpegCompressibility()}, {"j": 0.0}, "positive sum"),
        ({"j": JpegCompressibility()}, {"k": 1.0}, "same rewards"),
    ],
)
def test_weighted_sum_rejects_bad_weights(rewards, weights, message):
    with pytest.raises(ValueError, match=message):
        WeightedSum(rewards, weights)


def test_config_defaults_build_the_committed_digit_alignment():
    cfg = RewardConfig()
    assert cfg.weights == {"digit_alignment": 1.0} and cfg.options == {}
    assert isinstance(build_reward_from_config(cfg), DigitAlignment)


def test_config_with_two_rewards_builds_a_weighted_sum(tmp_path, heldout):
    shutil.copytree(DEFAULT_DIR, tmp_path / "clf")
    cfg = RewardConfig.model_validate(
        {
            "weights": {"digit_alignment": 1.0, "jpeg_compressibility": 0.5},
            "options": {"digit_alignment": {"path": str(tmp_path / "clf")}},
        }
    )
    reward = build_reward_from_config(cfg)
    assert isinstance(reward, WeightedSum)
    assert reward.weights == {"digit_alignment": 1.0, "jpeg_compressibility": 0.5}
    (tmp_path / "clf" / "model.safetensors").unlink()  # the configured path is the one that is read
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors"):
        build_reward_from_config(cfg)


def test_reward_options_are_checked_against_the_rewards_constructor():
    with pytest.raises(ValueError, match=r"digit_alignment has no option\(s\) \['pth'\]; it takes: path, device, "
                                         r"batch_size"):
        RewardConfig.model_validate({"options": {"digit_alignment": {"pth": "x"}}})
    with pytest.raises(ValueError, match=r"options for unknown reward 'no_such_reward'; known rewards: "):
        RewardConfig.model_validate({"options": {"no_such_reward": {}}})
    with pytest.raises(ValueError, match=r"pickscore has no option\(s\) \['model_path'\]; it takes: path, "):
        RewardConfig.model_validate({"options": {"pickscore": {"model_path": "x"}}})
    reward = build_reward_from_config(RewardConfig.model_validate({"options": {"digit_alignment": {"batch_size": 7}}}))
    assert reward.batch_size == 7


def test_single_reward_with_a_weight_other_than_one_keeps_its_scale(heldout):
    reward = build_reward_from_config(RewardConfig(weights={"jpeg_compressibility": 2.0}))
    images, prompts = heldout.images[:3], prompts_for(heldout.labels[:3])
    torch.testing.assert_close(reward(images, prompts), 2.0 * JpegCompressibility()(images, prompts))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"weights": {"no_such_reward": 1.0}}, r"unknown reward\(s\) \['no_such_reward'\]; known rewards: "
         r".*digit_alignment, .*jpeg_compressibility"),
        ({"weights": {"digit_alignment": 0.0}}, "positive"),
        ({"weights": {"digit_alignment": -1.0}}, "positive"),
        ({"weights": {}}, "at least one reward"),
        ({"weight": {"digit_alignment": 1.0}}, "Extra inputs are not permitted"),
    ],
)
def test_config_rejects_bad_sections(data, message):
    with pytest.raises(ValidationError, match=message):
        RewardConfig.model_validate(data)


def test_every_digit_word_is_understood(alignment, heldout):
    # One real image of each digit, prompted with every template word; all ten must be read.
    firsts = torch.stack([heldout.images[heldout.labels == d][0] for d in range(10)])
    details = alignment.details(firsts, [f"a scan of a handwritten {word}" for word in DIGIT_WORDS])
    assert details["accuracy"].sum() >= 9


def test_digit_margin_is_the_log_odds_and_keeps_separating_what_digit_alignment_saturates(heldout):
    margin = build_reward("digit_margin")
    images, prompts = heldout.images[:200], prompts_for(heldout.labels[:200])
    scores, details = margin.score_and_details(images, prompts)
    log_p = build_reward("digit_alignment")(images, prompts)
    assert torch.equal(details["digit_alignment"], log_p)  # the same images, both rewards in one pass
    assert torch.isfinite(scores).all()
    # log p − log(1 − p), where float32 still resolves 1 − p (for most clean digits log p rounds to exactly 0)
    resolved = log_p < -1e-2
    assert resolved.sum() >= 10
    torch.testing.assert_close(scores[resolved], (log_p - torch.log(-torch.expm1(log_p)))[resolved], rtol=1e-3,
                               atol=1e-3)
    order = torch.argsort(scores)  # an increasing function of p: never ranks two samples the other way round
    assert bool((log_p[order].diff() >= -1e-6).all())  # up to float32 rounding of log p near 0
    clean = log_p > -1e-3  # digit_alignment has all but reached its ceiling of 0 here
    assert clean.sum() >= 20
    assert float(log_p[clean].std()) < 1e-3 < 1.0 < float(scores[clean].std())
    wrong = prompts_for((heldout.labels[:200] + 1) % 10)
    assert float(margin(images, wrong).max()) < float(scores.median())


@pytest.mark.parametrize("name", ["digit_alignment", "digit_margin", "jpeg_compressibility"])
def test_the_scorer_path_scores_as_in_process(name, heldout):
    """jpeg_compressibility encodes 8-bit pixels, so its images travel as uint8; the digit classifier
    reads the floats, so the embedded world's travel as float32."""
    images = off_grid(heldout.images[:16].float())
    payload = assert_scorer_path_is_exact(build_reward(name), images, prompts_for(heldout.labels[:16]))
    assert payload.dtype == (np.uint8 if name == "jpeg_compressibility" else np.float32)


def test_the_rewards_that_read_only_8_bits_are_declared_on_their_classes():
    """The one place uint8 images are decided: each class's `reads_uint8` (the scorer path tests above and in
    the other reward tests check each declaration both ways)."""
    from rewards.base import reward_class

    assert sorted(n for n in known_rewards() if reward_class(n).reads_uint8) == [
        "aesthetic", "imagereward", "jpeg_compressibility", "ocr", "pickscore"]
