"""A reward scored the way scorer actors score it, checked against the reward in process on the floats.

The scorer path: the caller's payload (`rewards.uint8_images.image_payload`: uint8 when the reward declares
`reads_uint8`, else float32), then the scorer's batch (`actors.reward_scorer.score_components`, which turns
the payload back into float images). Ray only carries the payload's bytes in between. Every reward's tests
run this on images off the 8-bit grid, so a reward that declares `reads_uint8` wrongly would differ.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from actors.reward_scorer import score_components
from rewards import Metadata, Reward
from rewards.uint8_images import from_uint8, image_payload, reads_only_uint8, to_uint8


def assert_scorer_path_is_exact(reward: Reward, images: torch.Tensor, prompts: Sequence[str],
                                metadata: Sequence[Metadata] | None = None) -> np.ndarray:
    """The scorer path gives bitwise the in-process scores and details of the float `images`; its payload is
    uint8 exactly when the reward declares `reads_uint8` (one byte per value, else four). When the reward
    reads floats, uint8 images would change its scores (so it must keep float32). Returns the payload."""
    metadata = [{} for _ in prompts] if metadata is None else list(metadata)
    on_grid = from_uint8(to_uint8(images))
    assert not torch.equal(images, on_grid), "use images off the 8-bit grid: on it, uint8 is trivially exact"
    uint8 = reads_only_uint8([reward.name])
    assert uint8 == reward.reads_uint8
    payload = image_payload(images, uint8)
    assert payload.dtype == (np.uint8 if uint8 else np.float32)
    assert payload.nbytes == images.numel() * (1 if uint8 else 4)
    (scores, details), = [r[reward.name] for r in score_components({reward.name: reward},
                                                                      [(payload, list(prompts), metadata)])]
    expected, expected_details = reward.score_and_details(images, prompts, metadata)
    assert torch.equal(scores, expected)
    assert details.keys() == expected_details.keys()
    assert all(torch.equal(details[k], expected_details[k]) for k in details)
    if not uint8:
        assert not torch.equal(reward(on_grid, prompts, metadata), expected)
    return payload



def off_grid(images: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """`images` moved off the 8-bit grid by noise of 0.3/255 (not clamped: decoded images stray slightly
    outside [0, 1] too, which both paths must clamp alike)."""
    noise = torch.randn(images.shape, generator=torch.Generator().manual_seed(seed))
    return images.float() + 0.3 / 255 * noise
