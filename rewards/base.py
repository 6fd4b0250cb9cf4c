"""The reward interface and the registry of rewards by name.

A reward maps a batch of images and their prompts to one float32 score per image:

    images:   float tensor [B, C, H, W] with values in [0, 1], C = 1 (grey) or 3 (RGB)
    prompts:  a sequence of B strings
    metadata: optional, B dicts of per-prompt metadata (a prompt set's JSONL fields, e.g.
              GenEval's `include`/`exclude`); rewards that need none ignore it
    →         float32 tensor [B] on the CPU (higher is better)

Subclasses implement `_compute`, which returns the scores and a dict of extra per-sample
diagnostics (each a float32 tensor [B]); the base class validates the inputs once, up front,
and exposes `__call__` (scores only), `details` (diagnostics only) and `score_and_details`
(both from one forward pass).

Rewards are registered under a name with `@register_reward("name")` and built with
`build_reward("name", **options)`. A reward that needs something of its prompts (a digit named, quoted
text, GenEval metadata) says so in `check_prompts`, which the preflight runs on the whole prompt sets
without building the reward.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import torch

Metadata = Mapping[str, Any]

# Values may stray this far outside [0, 1] (decoding round-off) before inputs are rejected;
# rewards clamp to [0, 1] before scoring.
RANGE_TOLERANCE = 1e-2


def validate_inputs(images: torch.Tensor, prompts: Sequence[str]) -> None:
    """Raise ValueError (TypeError for wrong types) naming the problem with a reward's inputs."""
    if not isinstance(images, torch.Tensor):
        raise TypeError(f"images must be a torch.Tensor, got {type(images).__name__}")
    if not images.is_floating_point():
        raise ValueError(f"images must be a float tensor with values in [0, 1], got dtype {images.dtype}")
    if images.ndim != 4:
        raise ValueError(f"images must have rank 4 [B, C, H, W], got shape {tuple(images.shape)}")
    if images.shape[1] not in (1, 3):
        raise ValueError(
            f"images must have 1 (grey) or 3 (RGB) channels, got {images.shape[1]} "
            f"(shape {tuple(images.shape)})"
        )
    if isinstance(prompts, str | bytes) or not isinstance(prompts, Sequence):
        raise ValueError(
            f"prompts must be a sequence of strings (one per image), got {type(prompts).__name__}"
        )
    if len(prompts) != images.shape[0]:
        raise ValueError(
            f"got {images.shape[0]} images but {len(prompts)} prompts: need one prompt per image"
        )
    for i, prompt in enumerate(prompts):
        if not isinstance(prompt, str):
            raise ValueError(f"prompt {i} must be a string, got {type(prompt).__name__}")
    if images.numel() == 0:
        return
    if not bool(torch.isfinite(images).all()):
        raise ValueError("images contain NaN or infinite values")
    low, high = float(images.min()), float(images.max())
    if low < -RANGE_TOLERANCE or high > 1.0 + RANGE_TOLERANCE:
        raise ValueError(
            f"image values must lie in [0, 1] (tolerance {RANGE_TOLERANCE}), "
            f"got min {low:.4g}, max {high:.4g}; decode model outputs with image = (x + 1) / 2 and clamp"
        )


class Reward(abc.ABC):
    """A reward: images [B, C, H, W] in [0, 1] + B prompts → float32 [B] on the CPU.

    `reads_uint8`: the reward's first step is `rewards.uint8_images.to_uint8` (round(clamp(x, 0, 1)·255)),
    and it reads nothing else of the images, so 8-bit images score bitwise as the floats they came from and
    may travel to scorer actors as uint8. Declared per class, where the preprocessing is; False (the floats
    are read) unless the class says otherwise.
    """

    name: str = "reward"
    reads_uint8: ClassVar[bool] = False

    @abc.abstractmethod
    def _compute(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Metadata]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Scores [B] and per-sample diagnostics, for inputs that already passed `validate_inputs`."""

    def score_and_details(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Metadata] | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The rewards (float32 [B], CPU) and the diagnostics, computed once."""
        validate_inputs(images, prompts)
        metadata = [{} for _ in prompts] if metadata is None else list(metadata)
        if len(metadata) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(metadata)} metadata entries: need one per prompt")
        scores, details = self._compute(images, list(prompts), metadata)
        # clone(): plain tensors the caller may modify in place (not inference-mode tensors).
        scores = scores.detach().to(device="cpu", dtype=torch.float32).clone()
        if scores.shape != (images.shape[0],):
            raise RuntimeError(
                f"{self.name} returned shape {tuple(scores.shape)}, expected ({images.shape[0]},)"
            )
        details = {
            key: value.detach().to(device="cpu", dtype=torch.float32).clone()
            for key, value in details.items()
        }
        return scores, details

    def __call__(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Metadata] | None = None
    ) -> torch.Tensor:
        return self.score_and_details(images, prompts, metadata)[0]

    def details(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Metadata] | None = None
    ) -> dict[str, torch.Tensor]:
        """Extra per-sample diagnostics (name → float32 [B]), e.g. digit_alignment's `accuracy`."""
        return self.score_and_details(images, prompts, metadata)[1]

    @classmethod
    def check_prompts(cls, prompts: Sequence[str], metadata: Sequence[Metadata]) -> None:
        """ValueError naming the first prompt (its index) this reward cannot score, and what it needs.

        Called on whole prompt sets (texts and their metadata) before any work starts, so a prompt set the
        reward cannot read stops a job before its actors load; `_compute` applies the same rules.
        The default accepts every prompt: most rewards read any text, and need no metadata.
        """
        return None

    @classmethod
    def required_files(cls, **options: Any) -> list[WeightFile]:
        """The files this reward loads for these constructor options (none for weight-free rewards).

        Checked before any work starts (`rewards.config.check_reward_files`) and again by the
        constructor, so a missing file is named together with where it comes from.
        """
        return []

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class WeightFile(NamedTuple):
    """A file a reward loads: where it must be, and where a user gets it (the official release)."""

    path: Path
    source: str


def missing_files(files: Sequence[WeightFile]) -> list[WeightFile]:
    return [file for file in files if not file.path.is_file()]


def require_files(reward: str, files: Sequence[WeightFile]) -> None:
    """FileNotFoundError naming every missing file of `reward` and where each comes from."""
    missing = missing_files(files)
    if missing:
        lines = "\n".join(f"  {file.path}  (from {file.source})" for file in missing)
        raise FileNotFoundError(f"reward {reward!r} is missing weight file(s):\n{lines}\n"
                                f"place them there or point reward.options.{reward}.path at the folder that has them")


_REGISTRY: dict[str, Callable[..., Reward]] = {}


def register_reward(name: str) -> Callable[[type[Reward]], type[Reward]]:
    """Class decorator: make a Reward subclass buildable as `build_reward(name, **options)`."""

    def decorator(cls: type[Reward]) -> type[Reward]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"a reward named {name!r} is already registered ({_REGISTRY[name]})")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorator


def known_rewards() -> list[str]:
    """Names `build_reward` accepts, sorted."""
    return sorted(_REGISTRY)


def reward_class(name: str) -> Callable[..., Reward]:
    """The class registered under `name`."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown reward {name!r}; known rewards: {', '.join(known_rewards())}")
    return _REGISTRY[name]


def build_reward(name: str, **options: object) -> Reward:
    """The reward registered under `name`, constructed with `options` (keyword arguments)."""
    return reward_class(name)(**options)
