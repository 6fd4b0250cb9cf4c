"""Pictures a run leaves behind: sample grids (PNG)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from learner.grid_layout import MAX_ENLARGE, MAX_GRID_SIDE, resized, tile_size


def save_image_grid(images: torch.Tensor, rows: int, path: str | Path, *, pad: int = 2,
                    max_side: int = MAX_GRID_SIDE) -> Path:
    """Tile images [B, C, H, W] in [0, 1] into `rows` rows (row-major) as a PNG whose long side is at most
    `max_side`: small samples enlarged (nearest, up to 4×, the padding with them), large ones shrunk into
    it — and then also written at full resolution, one PNG each, in the folder `<path without .png>/`
    (`r<row>_c<column>.png`)."""
    if images.dim() != 4 or images.shape[0] % rows:
        raise ValueError(f"need [B, C, H, W] images with B a multiple of rows={rows}, got {tuple(images.shape)}")
    b, c, h, w = images.shape
    cols = b // rows
    pixels = (images.clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy()
    if c == 1:
        pixels = np.repeat(pixels, 3, axis=1)
    tiles = pixels.transpose(0, 2, 3, 1)  # [B, H, W, 3]
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    scale = min(MAX_ENLARGE, max_side // max(rows * (h + pad) + pad, cols * (w + pad) + pad))
    if scale < 1:  # too large to show whole: thumbnails in the grid, every sample kept beside it
        full = out.with_suffix("")
        full.mkdir(exist_ok=True)
        for i, tile in enumerate(tiles):
            Image.fromarray(tile).save(full / f"r{i // cols}_c{i % cols}.png")
        h, w = tile_size(h, w, rows, cols, pad=pad, max_side=max_side, enlarge=1)
        tiles, scale = [resized(tile, (h, w)) for tile in tiles], 1
    canvas = np.full((rows * (h + pad) + pad, cols * (w + pad) + pad, 3), 40, dtype=np.uint8)
    for i in range(b):
        r, col = divmod(i, cols)
        y, x = pad + r * (h + pad), pad + col * (w + pad)
        canvas[y : y + h, x : x + w] = tiles[i]
    image = Image.fromarray(canvas)
    image.resize((image.width * scale, image.height * scale), Image.NEAREST).save(out)
    return out


def save_reward_curve(history: list[dict], path: str | Path, *, base: dict | None = None) -> Path:
    """Held-out reward (and accuracy, when known) against iterations, with the batch reward beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    evals = ([{"iteration": 0, **base}] if base else []) + [
        {**m, "iteration": m["iteration"] + 1} for m in history if "eval_reward" in m
    ]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.plot([m["iteration"] + 1 for m in history], [m["reward_mean"] for m in history], color="0.6", lw=1,
            label="batch reward (kept samples)")
    ax.plot([e["iteration"] for e in evals], [e["eval_reward"] for e in evals], marker="o", label="held-out reward")
    ax.set_xlabel("iteration")
    ax.set_ylabel("digit_alignment (log p)")
    if evals and "eval_accuracy" in evals[0]:
        acc = ax.twinx()
        acc.plot([e["iteration"] for e in evals], [e["eval_accuracy"] for e in evals], color="tab:green", ls="--",
                 marker="s", ms=3, label="held-out accuracy")
        acc.set_ylabel("held-out accuracy")
        acc.legend(loc="lower right", fontsize=8)
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
