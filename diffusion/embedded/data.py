"""The embedded world's data: handwritten digits shipped inside scikit-learn, and prompts in words.

`sklearn.datasets.load_digits` holds 1797 grey 8×8 digits (values 0..16). They are upsampled to
16×16 with bilinear interpolation so the tiny transformer sees 8×8 = 64 patches of 2×2.
Pixel convention: images are float32 in [0, 1] (ink is bright); the flow model works on
x = 2·image − 1 in [−1, 1] and decodes with image = (x + 1) / 2.

The split is fixed (every fifth digit is held out) so the classifier that scores the world never
sees the held-out digits the tests use as "real images".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F

IMAGE_SIZE = 16
DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")

# Prompts the model is pretrained and RL-trained on, and templates kept for held-out evaluation.
TRAIN_TEMPLATES = (
    "a handwritten digit {word}",
    "the number {word} written by hand",
    "a drawing of the digit {word}",
)
HELDOUT_TEMPLATES = ("a scan of a handwritten {word}",)

_WORD_PATTERN = re.compile(r"\b(" + "|".join(DIGIT_WORDS) + r")\b")


@dataclass(frozen=True)
class DigitImages:
    images: torch.Tensor  # float32 [N, 1, 16, 16] in [0, 1]
    labels: torch.Tensor  # int64 [N]


def load_digit_images(split: str = "train") -> DigitImages:
    """The digits of one split ("train", "heldout" or "all"), upsampled to 16×16, in [0, 1]."""
    from sklearn.datasets import load_digits

    if split not in ("train", "heldout", "all"):
        raise ValueError(f"unknown split {split!r}: use 'train', 'heldout' or 'all'")
    digits = load_digits()
    images = torch.from_numpy(digits.images).float().div_(16.0).unsqueeze(1)
    images = F.interpolate(images, size=(IMAGE_SIZE, IMAGE_SIZE), mode="bilinear", align_corners=False)
    images = images.clamp_(0.0, 1.0)
    labels = torch.from_numpy(digits.target).long()
    heldout = torch.arange(len(labels)) % 5 == 4
    keep = {"train": ~heldout, "heldout": heldout, "all": torch.ones_like(heldout)}[split]
    return DigitImages(images=images[keep].contiguous(), labels=labels[keep].contiguous())


def prompt_for(digit: int, template: str = TRAIN_TEMPLATES[0]) -> str:
    """The prompt in words for a digit, e.g. 7 → "a handwritten digit seven"."""
    if not 0 <= digit <= 9:
        raise ValueError(f"digit must be in 0..9, got {digit}")
    return template.format(word=DIGIT_WORDS[digit])


def train_prompts() -> list[str]:
    """All training prompts: every template for every digit (30 prompts)."""
    return [prompt_for(d, t) for t in TRAIN_TEMPLATES for d in range(10)]


def heldout_prompts() -> list[str]:
    """Prompts with templates never used in training (10 prompts)."""
    return [prompt_for(d, t) for t in HELDOUT_TEMPLATES for d in range(10)]


def digit_from_prompt(prompt: str) -> int:
    """The digit a prompt asks for; exactly one digit word must appear in it."""
    found = set(_WORD_PATTERN.findall(prompt.lower()))
    if len(found) != 1:
        raise ValueError(
            f"prompt {prompt!r} must name exactly one digit in words ({', '.join(DIGIT_WORDS)}); "
            f"found {sorted(found) or 'none'}"
        )
    return DIGIT_WORDS.index(found.pop())
