"""digit_alignment: how surely the digit classifier sees the prompted digit in the image.

reward = log p(prompted digit | image) = log_softmax(classifier(image))[digit]  (always ≤ 0)

The log-probability is used rather than the probability because a probability saturates near 1:
a clean "7" and a slightly better "7" both score ≈ 0.999 and rank almost arbitrarily, while
their log-probabilities (≈ −1e-3 vs −1e-5) still separate them — and on bad images the log keeps
distinguishing "unlikely" from "hopeless" instead of squashing both to ≈ 0.

The prompted digit is read from the prompt's words (`digit_from_prompt`: exactly one of
"zero".."nine"); `check_prompts` applies that rule to a whole prompt set before a job starts.
Inputs of any size are resized to 16×16 with bilinear interpolation (antialiased, which matters
only when shrinking); 3-channel inputs are converted to grey by averaging the channels.
`details` reports per sample `accuracy` (1.0 where the classifier's argmax equals the prompted
digit), `predicted_digit` and `prob` (the probability of the prompted digit).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from diffusion.embedded.data import digit_from_prompt
from rewards.base import Metadata, Reward, WeightFile, register_reward
from rewards.digit_classifier import CONFIG_FILE, REBUILD_COMMAND, WEIGHTS_FILE, load_classifier


def prompted_digits(prompts: Sequence[str]) -> torch.Tensor:
    """The digit each prompt names, int64 [B]; ValueError naming the prompt's index otherwise."""
    digits = []
    for i, prompt in enumerate(prompts):
        try:
            digits.append(digit_from_prompt(prompt))
        except ValueError as error:
            raise ValueError(f"prompt {i}: {error}") from None
    return torch.tensor(digits, dtype=torch.long)


@register_reward("digit_alignment")
class DigitAlignment(Reward):
    """Log-probability the digit classifier assigns to the digit the prompt names (≤ 0)."""

    reads_uint8 = False  # the classifier reads the float pixels

    def __init__(
        self, path: str | Path | None = None, device: str | torch.device = "cpu", batch_size: int = 512
    ) -> None:
        """`path`: folder with config.json + model.safetensors (None → the committed artifact)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.classifier = load_classifier(path, device=device)
        self.device = torch.device(device)
        self.batch_size = batch_size

    @classmethod
    def required_files(cls, **options: object) -> list[WeightFile]:
        """A classifier folder's config and weights; none for the committed one (`path` None)."""
        path = options.get("path")
        if path is None:
            return []
        source = f"`{REBUILD_COMMAND} --out {path}`"
        return [WeightFile(Path(str(path)) / name, source) for name in (CONFIG_FILE, WEIGHTS_FILE)]

    @classmethod
    def check_prompts(cls, prompts: Sequence[str], metadata: Sequence[Metadata]) -> None:
        """Every prompt must name exactly one digit in words (`prompted_digits`, as `_compute` reads it)."""
        try:
            prompted_digits(prompts)
        except ValueError as error:
            raise ValueError(f"{error} (the embedded prompt sets, 'embedded', name one each)") from None

    def preprocess(self, images: torch.Tensor) -> torch.Tensor:
        """Float32 grey [B, 1, 16, 16] in [0, 1] on the classifier's device."""
        images = images.to(device=self.device, dtype=torch.float32).clamp(0.0, 1.0)
        if images.shape[1] == 3:
            images = images.mean(dim=1, keepdim=True)
        size = self.classifier.config.image_size
        if images.shape[-2:] != (size, size):
            images = F.interpolate(
                images, size=(size, size), mode="bilinear", align_corners=False, antialias=True
            )
            images = images.clamp(0.0, 1.0)
        return images

    def logits(self, images: torch.Tensor) -> torch.Tensor:
        """The classifier's float32 logits [B, 10] on the CPU."""
        with torch.inference_mode():
            pixels = self.preprocess(images)
            return torch.cat([self.classifier(chunk).float() for chunk in pixels.split(self.batch_size)]).cpu()

    def _compute(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Metadata]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        digits = prompted_digits(prompts)
        logits = self.logits(images) if len(digits) else torch.zeros(0, 10)
        predicted = logits.argmax(dim=1)
        scores, extra = self.score_logits(logits, digits)
        return scores, {"accuracy": (predicted == digits).float(), "predicted_digit": predicted.float(), **extra}

    def score_logits(self, logits: torch.Tensor, digits: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The reward from the classifier's logits [B, 10] and the prompted digits [B], and its own details:
        log p(digit) and its probability `prob`."""
        scores = F.log_softmax(logits, dim=1).gather(1, digits[:, None]).squeeze(1)
        return scores, {"prob": scores.exp()}
