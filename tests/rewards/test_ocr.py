"""The ocr reward: the official Flow-GRPO scoring rule, and real OCR on rendered text (offline)."""

from __future__ import annotations

import functools
import socket

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw, ImageFont
from scorer_path import assert_scorer_path_is_exact, off_grid

from rewards.base import build_reward, known_rewards
from rewards.ocr import OcrReward, edit_distance, normalise, ocr_distance, ocr_score, quoted_text


def reference_distance(a: str, b: str) -> int:
    """Levenshtein distance by memoised recursion over suffixes (independent of the module's DP)."""

    @functools.cache
    def d(i: int, j: int) -> int:
        if i == len(a):
            return len(b) - j
        if j == len(b):
            return len(a) - i
        if a[i] == b[j]:
            return d(i + 1, j + 1)
        return 1 + min(d(i + 1, j), d(i, j + 1), d(i + 1, j + 1))

    return d(0, 0)


def render(text: str, width: int = 384, height: int = 96, size: int = 40) -> torch.Tensor:
    """Black text centred on white, as float RGB [3, H, W] in [0, 1]."""
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=size)
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    origin = ((width - (right - left)) // 2 - left, (height - (bottom - top)) // 2 - top)
    draw.text(origin, text, fill="black", font=font)
    return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1).float() / 255.0


@pytest.fixture(scope="module")
def reward() -> OcrReward:
    return build_reward("ocr", device="cpu", num_threads=1)


def test_edit_distance_matches_hand_checked_cases_and_an_independent_reference():
    assert edit_distance("kitten", "sitting") == 3
    assert edit_distance("flaw", "lawn") == 2
    assert edit_distance("", "abc") == edit_distance("abc", "") == 3
    assert edit_distance("same", "same") == 0
    for a, b in [("helloworld", "helpwanted"), ("openai", "opensource"), ("abcdef", "fedcba"), ("x", "xyzzy")]:
        assert edit_distance(a, b) == edit_distance(b, a) == reference_distance(a, b)


def test_target_is_the_first_quoted_span_as_split_on_double_quotes():
    assert quoted_text('a neon sign that says "Open Now" at night') == "Open Now"
    assert quoted_text('"A" and "B"') == "A"
    assert quoted_text('a sign that says "unterminated') == "unterminated"
    with pytest.raises(ValueError, match="double quotes"):
        quoted_text("a sign with ‘curly’ quotes only")
    assert normalise(" Hello  World ") == "helloworld"


def test_scoring_rule_substring_normalisation_and_cap():
    assert ocr_score("Open Now", "WE ARE OPEN NOW!") == 1.0  # substring → distance 0
    assert ocr_score("hello world", "HeLLo   wOrld") == 1.0  # case and spaces ignored
    assert ocr_distance("abcd", "abxd") == 1
    assert ocr_score("abcd", "abxd") == pytest.approx(0.75)
    assert ocr_score("abcd", "") == 0.0
    # Many unrelated characters: the distance is capped at the target's length, never below 0.
    assert ocr_distance("ab", "zzzzzzzzzz") == 2
    assert ocr_score("ab", "zzzzzzzzzz") == 0.0


def test_real_ocr_scores_rendered_text(reward):
    hello, sign = render("Hello World"), render("OPEN NOW 24H")
    blank = torch.ones(3, 96, 384)
    grey = hello.mean(dim=0, keepdim=True)
    images = torch.stack([hello, hello, hello, sign, blank])
    prompts = [
        'a wooden sign that says "Hello World"',
        'a wooden sign that says "hELLO   world"',  # case and spaces are normalised away
        'a wooden sign that says "Help Wanted"',
        'a shop window with "open now" painted on it',  # a substring of what is read
        'a blank page with "Hello World" nowhere',
    ]
    scores, details = reward.score_and_details(images, prompts)
    expected_distance = min(reference_distance("helloworld", "helpwanted"), len("helpwanted"))
    assert expected_distance == 6  # h-e-l match; l→p, o→w, w→a, o→n, r→t, l→e; d = d
    torch.testing.assert_close(
        scores, torch.tensor([1.0, 1.0, 1.0 - expected_distance / 10, 1.0, 0.0]), rtol=0, atol=1e-6
    )
    torch.testing.assert_close(details["edit_distance"], torch.tensor([0.0, 0.0, 6.0, 0.0, 10.0]))
    torch.testing.assert_close(details["target_length"], torch.tensor([10.0, 10.0, 10.0, 7.0, 10.0]))
    torch.testing.assert_close(details["recognised_length"], torch.tensor([10.0, 10.0, 10.0, 10.0, 0.0]))
    # Grey (C = 1) images are read too.
    assert reward(grey[None], ['"Hello World"']).tolist() == [1.0]


def test_prompts_without_a_target_are_rejected_naming_the_prompt(reward):
    images = torch.ones(2, 3, 32, 32)
    with pytest.raises(ValueError, match=r"prompt 1: .*double quotes"):
        reward(images, ['"ok"', "no quotes here"])
    with pytest.raises(ValueError, match=r"prompt 0: .*empty"):
        reward(images, ['a sign that says "  "', '"ok"'])


def test_builds_and_scores_with_the_network_blocked(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("network access attempted in an offline test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    offline = OcrReward(device="cpu", num_threads=1)
    assert offline(render("SOL 2049")[None], ['a poster saying "sol 2049"']).tolist() == [1.0]


def test_registered_with_its_weight_files_and_a_clear_device_error(monkeypatch, tmp_path):
    assert "ocr" in known_rewards()
    files = OcrReward.required_files()
    assert {file.path.name for file in files} >= {"ch_PP-OCRv4_det_infer.onnx", "ch_PP-OCRv4_rec_infer.onnx"}
    assert all(file.path.is_file() for file in files)
    with pytest.raises(FileNotFoundError, match=r"en_rec\.onnx"):
        OcrReward(rec_model_path=tmp_path / "en_rec.onnx")
    import onnxruntime

    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
    with pytest.raises(RuntimeError, match="onnxruntime-gpu"):
        OcrReward(device="cuda")
    with pytest.raises(ValueError, match="batch_size"):
        OcrReward(batch_size=0)


def test_the_scorer_path_sends_uint8_and_scores_as_in_process(reward):
    images = off_grid(torch.stack([render("hello"), render("sol 42")]))
    payload = assert_scorer_path_is_exact(reward, images, ['a sign that says "hello"', 'a sign: "sol 42"'])
    assert payload.dtype == np.uint8
