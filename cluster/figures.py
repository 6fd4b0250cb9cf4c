"""Pictures a run leaves behind: sample grids (PNG)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image


def save_image_grid(images: torch.Tensor, rows: int, path: str | Path, *, scale: int = 4, pad: int = 2) -> Path:
    """Tile images [B, C, H, W] in [0, 1] into `rows` rows (row-major), upscaled `scale`× (nearest), as PNG."""
    if images.dim() != 4 or images.shape[0] % rows:
        raise ValueError(f"need [B, C, H, W] images with B a multiple of rows={rows}, got {tuple(images.shape)}")
    b, c, h, w = images.shape
    cols = b // rows
    pixels = (images.clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy()
    if c == 1:
        pixels = np.repeat(pixels, 3, axis=1)
    canvas = np.full((rows * (h + pad) + pad, cols * (w + pad) + pad, 3), 40, dtype=np.uint8)
    for i in range(b):
        r, col = divmod(i, cols)
        y, x = pad + r * (h + pad), pad + col * (w + pad)
        canvas[y : y + h, x : x + w] = pixels[i].transpose(1, 2, 0)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    image = Image.fromarray(canvas)
    image.resize((image.width * scale, image.height * scale), Image.NEAREST).save(out)
    return out
