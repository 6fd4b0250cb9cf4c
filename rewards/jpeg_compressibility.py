"""jpeg_compressibility (from DDPO): simpler images — fewer bytes as a JPEG — score higher.

reward = −(JPEG size in kB) / 500, with kB = 1000 bytes.

Each image is encoded as 8 bits per channel (round(x · 255) after clamping to [0, 1]) and saved
with PIL at quality 95 (PIL's other defaults); grey images (C = 1) as mode "L", RGB (C = 3) as
mode "RGB". The prompts are not used (only their count is checked). `details` reports `jpeg_kb`.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image

from rewards.base import Metadata, Reward, register_reward
from rewards.uint8_images import to_uint8

JPEG_QUALITY = 95
KB_SCALE = 500.0


def to_pil(image: torch.Tensor) -> Image.Image:
    """One image [C, H, W] in [0, 1] as an 8-bit PIL image ("L" for C = 1, "RGB" for C = 3)."""
    array = np.ascontiguousarray(to_uint8(image.cpu()).permute(1, 2, 0).numpy())
    if array.shape[2] == 1:
        return Image.fromarray(array[:, :, 0]).convert("L")
    return Image.fromarray(array).convert("RGB")


def jpeg_bytes(image: torch.Tensor, quality: int = JPEG_QUALITY) -> bytes:
    """The JPEG encoding of one image [C, H, W] in [0, 1]."""
    buffer = io.BytesIO()
    to_pil(image).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


@register_reward("jpeg_compressibility")
class JpegCompressibility(Reward):
    """−(JPEG size in kB) / 500 at quality 95: higher for images that compress well."""

    reads_uint8 = True  # JPEG encodes 8-bit pixels (`to_pil`)

    def __init__(self, quality: int = JPEG_QUALITY) -> None:
        if not 1 <= quality <= 95:
            raise ValueError(f"JPEG quality must be in 1..95, got {quality}")
        self.quality = quality

    def _compute(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Metadata]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        sizes = [len(jpeg_bytes(image, self.quality)) for image in images]
        kilobytes = torch.tensor(sizes, dtype=torch.float64) / 1000.0
        return -kilobytes / KB_SCALE, {"jpeg_kb": kilobytes}
