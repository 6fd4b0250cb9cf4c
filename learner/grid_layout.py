"""How big a grid of sample tiles is drawn: small samples enlarged, large ones shrunk into a pixel budget.

Every sample picture the system writes (the run's samples.png, the demo's before/after grid, the W&B and
TensorBoard grids) is a grid of rows × columns tiles. Enlarging by a fixed factor is right for the
embedded world's 32-px digits and wrong at 1024 px: 10 prompts × 6 seeds at 4× would be a ~41,000 ×
25,000 px PNG, gigabytes of RGB at the end of a run. `tile_size` keeps the grid's long side within
`MAX_GRID_SIDE`; a grid whose tiles had to shrink says so, and its caller writes the full-resolution
samples as separate files.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

MAX_GRID_SIDE = 4096  # px: the long side of any grid picture
MAX_ENLARGE = 4  # small samples are enlarged (nearest) at most this much


def tile_size(height: int, width: int, rows: int, cols: int, *, pad: int = 0, extra_height: int = 0,
              max_side: int = MAX_GRID_SIDE, enlarge: int = MAX_ENLARGE) -> tuple[int, int]:
    """(tile height, tile width) for `rows` × `cols` samples of `height` × `width` px, `pad` px between
    and around tiles and `extra_height` px under each (a caption): the largest whole enlargement up to
    `enlarge` that fits `max_side`, else the samples shrunk, aspect kept, to fit it."""
    def long_side(h: int, w: int) -> int:
        return max(rows * (h + extra_height + pad) + pad, cols * (w + pad) + pad)

    for factor in range(enlarge, 0, -1):
        if long_side(height * factor, width * factor) <= max_side:
            return height * factor, width * factor
    shrink = min((max_side - pad * (rows + 1)) / rows - extra_height, (max_side - pad * (cols + 1)) / cols * height
                 / width) / height
    return max(1, int(height * shrink)), max(1, int(width * shrink))


def resized(pixels: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """One uint8 HWC tile at (height, width): nearest when enlarging (crisp pixels), area-averaged when
    shrinking (no aliasing)."""
    h, w = size
    if (h, w) == pixels.shape[:2]:
        return pixels
    method = Image.NEAREST if h >= pixels.shape[0] else Image.BOX
    return np.asarray(Image.fromarray(pixels).resize((w, h), method))
