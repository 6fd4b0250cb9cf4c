"""Experiment logging to Weights & Biases and TensorBoard, as the official scripts log to W&B.

Every iteration's scalars (the metrics.jsonl record: `train/…`, `eval/…`, `seconds/…`) at step = iterations
done, and every evaluation's held-out sample grid, each sample captioned with its prompt and reward (W&B:
the grid and one image per sample; TensorBoard: the grid, rewards written under each tile, and a table of
them as text). Step 0 is the base model's evaluation. As in yifan123/flow_grpo `scripts/train_sd3.py`
(the main process logs sample images captioned "prompt | reward" with `wandb.log(..., step=global_step)`),
only the learner's rank 0 logs.

Neither package is required: `missing_extras` names the extra to install, and the launcher's preflight
refuses a config that asks for a sink whose package is missing before anything starts. A W&B run's id
derives from the run directory, so a resumed run continues the same W&B run (`resume="allow"`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from PIL import Image, ImageDraw

from learner.config import LoggingConfig, WandbConfig
from learner.grid_layout import resized, tile_size

# sink → (the module it imports, the extra that installs it)
EXTRAS = {"wandb": ("wandb", "wandb"), "tensorboard": ("tensorboard", "tensorboard")}
TILE = 96  # px: small images are enlarged (nearest) so a grid is readable
LABEL = 14  # px: the reward line under each tile of the labelled grid


def enabled(config: LoggingConfig) -> list[str]:
    return [name for name, on in (("wandb", config.wandb is not None), ("tensorboard", config.tensorboard)) if on]


def missing_extras(config: LoggingConfig) -> list[str]:
    """One line per sink the config asks for whose package is not installed, naming the extra."""
    lines = []
    for name in enabled(config):
        module, extra = EXTRAS[name]
        if importlib.util.find_spec(module) is None:
            lines.append(f"logging.{name} needs the {module} package, which is not installed: pip install "
                         f"-e '.[{extra}]' (or remove logging.{name} from the config)")
    return lines


def scalar_name(key: str) -> str:
    """metrics.jsonl key → logged name: eval_reward → eval/reward, train_s → seconds/train, else train/<key>."""
    if key.startswith("eval_"):
        return f"eval/{key.removeprefix('eval_')}"
    if key.endswith("_s"):
        return f"seconds/{key.removesuffix('_s')}"
    return f"train/{key}"


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
    return {scalar_name(k): float(v) for k, v in metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and k != "iteration"}


@dataclass
class GridSamples:
    prompts: list[str]  # one per sample, row-major (prompt p, seed s)
    images: torch.Tensor  # [N, C, H, W] in [0, 1]
    rewards: torch.Tensor  # [N]
    columns: int

    def tiles(self) -> list[np.ndarray]:
        """Each sample as uint8 HWC, enlarged to at least TILE px, or shrunk so that the labelled grid stays
        within `learner.grid_layout.MAX_GRID_SIDE`."""
        pixels = (self.images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).cpu()
        pixels = pixels.expand(-1, 3, -1, -1) if pixels.shape[1] == 1 else pixels[:, :3]
        h, w = pixels.shape[-2:]
        size = tile_size(h, w, math.ceil(len(pixels) / self.columns), self.columns, extra_height=LABEL,
                         enlarge=max(1, math.ceil(TILE / w)))
        return [resized(p.permute(1, 2, 0).numpy(), size) for p in pixels]

    def captions(self) -> list[str]:
        return [f"{prompt} · reward {float(r):.3f}" for prompt, r in zip(self.prompts, self.rewards, strict=True)]

    def labelled(self) -> np.ndarray:
        """The grid as one uint8 HWC image, each tile's reward written under it."""
        tiles = self.tiles()
        h, w = tiles[0].shape[:2]
        label, rows = LABEL, math.ceil(len(tiles) / self.columns)
        canvas = Image.new("RGB", (self.columns * w, rows * (h + label)), "white")
        draw = ImageDraw.Draw(canvas)
        for i, (tile, r) in enumerate(zip(tiles, self.rewards, strict=True)):
            x, y = (i % self.columns) * w, (i // self.columns) * (h + label)
            canvas.paste(Image.fromarray(tile), (x, y))
            draw.text((x + 2, y + h + 1), f"{float(r):.3f}", fill="black")
        return np.asarray(canvas)


class Sink(Protocol):
    def log(self, step: int, values: dict[str, float], grid: GridSamples | None) -> None: ...

    def close(self) -> None: ...


class TensorBoardSink:
    def __init__(self, folder: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(folder), flush_secs=10)

    def log(self, step: int, values: dict[str, float], grid: GridSamples | None) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, step)
        if grid is not None:
            self.writer.add_image("eval/samples", grid.labelled(), step, dataformats="HWC")
            rows = "\n".join(f"| {i} | {c.replace('|', '/')} |" for i, c in enumerate(grid.captions()))
            self.writer.add_text("eval/sample_rewards", "| sample | prompt · reward |\n|---|---|\n" + rows, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    def __init__(self, config: WandbConfig, run_dir: Path, name: str, run_config: dict[str, Any]) -> None:
        """Files in <run dir>/wandb/. console="off": the process's stdout stays Ray's to stream."""
        import wandb

        self.wandb = wandb
        run_id = "solrl-" + hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:12]
        self.run = wandb.init(project=config.project, entity=config.entity, mode=config.mode, dir=str(run_dir),
                              name=name, id=run_id, resume="allow", config=run_config,
                              settings=wandb.Settings(console="off"))

    def log(self, step: int, values: dict[str, float], grid: GridSamples | None) -> None:
        record: dict[str, Any] = dict(values)
        if grid is not None:
            record["eval/samples"] = self.wandb.Image(grid.labelled(), caption="held-out samples, reward under each")
            record["eval/sample_list"] = [self.wandb.Image(tile, caption=caption)
                                          for tile, caption in zip(grid.tiles(), grid.captions(), strict=True)]
        self.run.log(record, step=step)

    def close(self) -> None:
        self.run.finish()


class ExperimentLog:
    """The sinks a config asks for, opened under the run directory (`wandb/`, `tensorboard/`)."""

    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = sinks

    @classmethod
    def open(cls, config: LoggingConfig, run_dir: Path, name: str, run_config: dict[str, Any]) -> ExperimentLog | None:
        missing = missing_extras(config)
        if missing:
            raise ImportError("; ".join(missing))
        sinks: list[Sink] = []
        if config.tensorboard:
            sinks.append(TensorBoardSink(run_dir / "tensorboard"))
        if config.wandb is not None:
            sinks.append(WandbSink(config.wandb, run_dir, name, run_config))
        return cls(sinks) if sinks else None

    def log(self, step: int, metrics: dict[str, Any], grid: GridSamples | None = None) -> None:
        values = scalars(metrics)
        for sink in self.sinks:
            sink.log(step, values, grid)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
        self.sinks = []
