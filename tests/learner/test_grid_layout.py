"""Sample grids at real resolutions stay within their pixel budget; small samples are drawn as before."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from cluster.reports.figures import save_image_grid
from learner.experiment_log import GridSamples
from learner.grid_layout import MAX_GRID_SIDE, tile_size


def ramps(count: int, size: int, channels: int = 1) -> torch.Tensor:
    """`count` distinct images [count, C, size, size] in [0, 1]: a ramp per image, offset by its index."""
    ramp = torch.linspace(0, 1, size).expand(size, size)
    return torch.stack([((ramp + i / count) % 1).expand(channels, size, size) for i in range(count)])


def test_small_samples_are_enlarged_four_times_as_before(tmp_path):
    grid = Image.open(save_image_grid(ramps(60, 32), rows=10, path=tmp_path / "small.png"))
    assert grid.size == ((6 * 34 + 2) * 4, (10 * 34 + 2) * 4)  # 4× the padded canvas, pads included
    assert not (tmp_path / "small").exists()  # nothing shrunk: no separate files


def test_a_1024_px_grid_stays_within_its_budget_and_keeps_every_sample(tmp_path):
    images = ramps(30, 1024)  # 5 prompts × 6 seeds at 1024 px: 6,200 px wide at 1×
    grid = Image.open(save_image_grid(images, rows=5, path=tmp_path / "samples.png"))
    assert max(grid.size) <= MAX_GRID_SIDE and min(grid.size) > 2000  # shrunk to fit, not to a stamp
    kept = sorted(p.name for p in (tmp_path / "samples").iterdir())
    assert len(kept) == 30 and "r4_c5.png" in kept
    full = np.asarray(Image.open(tmp_path / "samples" / "r2_c3.png"))
    expected = (images[2 * 6 + 3, 0] * 255).round().to(torch.uint8).numpy()
    assert full.shape == (1024, 1024, 3) and np.array_equal(full[..., 0], expected)


def test_the_logged_grid_shrinks_its_tiles_at_1024_px():
    samples = GridSamples(["a digit"] * 16, ramps(16, 1024), torch.zeros(16), columns=4)
    picture = samples.labelled()
    assert max(picture.shape[:2]) <= MAX_GRID_SIDE
    h, w = tile_size(1024, 1024, 4, 4, extra_height=14)
    assert picture.shape[:2] == (4 * (h + 14), 4 * w) and h == w < 1024


def test_tile_size_picks_the_largest_whole_enlargement_that_fits():
    assert tile_size(32, 32, 2, 3, enlarge=3) == (96, 96)
    assert tile_size(1000, 1000, 2, 2, enlarge=4) == (2000, 2000)  # 2 × 2000 = 4000 ≤ 4096; 3× would not fit
    assert tile_size(1024, 512, 1, 16, enlarge=1) == (512, 256)  # the width binds: 16 × 256 = 4096


def test_the_base_models_grid_is_the_reference_view_beside_the_trained_one(small_trainer):
    """After one update the trained grid moves, the base grid is the untouched model's (the same as before
    any update), and the before/after picture puts each prompt's base seeds left of its trained ones."""
    from cluster.reports.summary import before_after

    trainer = small_trainer("eval.prompts=2")
    untouched = trainer.sample_images(2)
    trainer.train_iteration(0)
    trainer.publish()
    trainer.finish_iteration()
    trained, base = trainer.sample_images(2), trainer.sample_images(2, base=True)
    assert torch.equal(base, untouched) and not torch.equal(trained, untouched)
    pairs = before_after(base, trained, 2)
    assert [torch.equal(pairs[i], image) for i, image in enumerate([base[0], base[1], trained[0], trained[1]])] \
        == [True] * 4
