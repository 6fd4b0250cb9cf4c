"""Images as 8 bits: the rounding rule of the rewards that read 8-bit images, and its inverse.

    to_uint8(images)   round(clamp(x, 0, 1) · 255) as uint8: what the official reward code computes from
                       the [0, 1] floats before its PIL / JPEG / CLIP-processor steps
    from_uint8(pixels) u / 255 in float32: floats that `to_uint8` maps back to exactly u

A reward whose class declares `reads_uint8 = True` (`rewards.base.Reward`) applies this rounding first and
reads nothing else of its images, so it scores `from_uint8(to_uint8(x))` bitwise as `x`: its images may
travel to a scorer actor as uint8, a quarter of float32's bytes (`image_payload`). Every reward of a set
must declare it for the set's images to travel as uint8; one that reads the floats themselves (a CLIP
transform on the float tensor, a classifier) keeps float32 — each reward's tests check the declaration.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from rewards.base import reward_class


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """round(clamp(x, 0, 1) · 255) as uint8, on the images' device (rounding half to even, as torch does
    everywhere); the rule `to_pil`, the OCR reward and the CLIP processor transform apply."""
    # clamp makes the one float temporary, scaled and rounded in place: a 96-candidate slot at 1024² is
    # 1.2 GB of float32 on the explorer's device, and three temporaries would be 3.6 GB
    return images.detach().float().clamp(0.0, 1.0).mul_(255.0).round_().to(torch.uint8)


def from_uint8(pixels: torch.Tensor) -> torch.Tensor:
    """u / 255 in float32: in [0, 1], and `to_uint8` of it is u again (the division is off by at most
    half an ulp, far below the 0.5 that would change the rounding)."""
    return pixels.float() / 255.0


def reads_only_uint8(names: Iterable[str]) -> bool:
    """Whether every reward registered under `names` declares `reads_uint8`: then uint8 images score
    bitwise as the floats they were rounded from, and they may travel as uint8."""
    return all(getattr(reward_class(name), "reads_uint8", False) for name in names)


def image_payload(images: torch.Tensor, uint8: bool) -> np.ndarray:
    """What travels to a scorer: contiguous uint8 (`to_uint8`, rounded on the images' device, so a quarter
    of the bytes also crosses from the GPU) or float32 pixels [B, C, H, W] on the CPU."""
    pixels = to_uint8(images) if uint8 else images.detach().to(dtype=torch.float32)
    return np.ascontiguousarray(pixels.cpu().numpy())


def payload_images(payload: np.ndarray) -> torch.Tensor:
    """A payload as the float32 images rewards take: uint8 through `from_uint8`, float32 as it is."""
    pixels = torch.from_numpy(payload)
    return from_uint8(pixels) if pixels.dtype == torch.uint8 else pixels
