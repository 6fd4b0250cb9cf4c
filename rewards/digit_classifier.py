"""The digit classifier that scores the embedded world: a small CNN on grey 16×16 images in [0, 1].

Architecture (≈ 40k parameters):
    conv3×3(1→c1) ReLU maxpool2  → [c1, 8, 8]
    conv3×3(c1→c2) ReLU maxpool2 → [c2, 4, 4]
    flatten → linear(16·c2 → hidden) ReLU → linear(hidden → 10) logits

Saved as a folder with `config.json` (architecture + format) and `model.safetensors` (weights);
only those two formats are read back — never pickle. `rewards.train_digit_classifier` builds it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
METRICS_FILE = "metrics.json"
FORMAT = "sol-rl/digit-classifier/v1"
DEFAULT_DIR = Path(__file__).resolve().parent / "artifacts" / "digit_classifier"
REBUILD_COMMAND = "python -m rewards.train_digit_classifier"


@dataclass(frozen=True)
class ClassifierConfig:
    image_size: int = 16
    num_classes: int = 10
    channels1: int = 16
    channels2: int = 32
    hidden: int = 64


class DigitClassifier(nn.Module):
    """Logits [B, 10] for grey images [B, 1, 16, 16] in [0, 1]."""

    def __init__(self, config: ClassifierConfig | None = None) -> None:
        super().__init__()
        self.config = config or ClassifierConfig()
        c = self.config
        if c.image_size % 4 != 0:
            raise ValueError(f"image_size must be a multiple of 4, got {c.image_size}")
        self.features = nn.Sequential(
            nn.Conv2d(1, c.channels1, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(c.channels1, c.channels2, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        flat = c.channels2 * (c.image_size // 4) ** 2
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(flat, c.hidden), nn.ReLU(), nn.Linear(c.hidden, c.num_classes)
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        size = self.config.image_size
        if images.ndim != 4 or images.shape[1:] != (1, size, size):
            raise ValueError(f"classifier expects [B, 1, {size}, {size}], got {tuple(images.shape)}")
        return self.head(self.features(images))


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def save_classifier(model: DigitClassifier, folder: str | Path) -> Path:
    """Write `config.json` and `model.safetensors` into `folder` (created if needed)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"format": FORMAT, **asdict(model.config)}
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    state = {name: tensor.detach().cpu().contiguous() for name, tensor in model.state_dict().items()}
    save_file(state, str(folder / WEIGHTS_FILE), metadata={"format": FORMAT})
    return folder


def load_classifier(folder: str | Path | None = None, device: str | torch.device = "cpu") -> DigitClassifier:
    """The classifier saved in `folder` (default: the committed artifact), in eval mode.

    Raises FileNotFoundError naming the missing file and the command that rebuilds it.
    """
    folder = Path(folder) if folder is not None else DEFAULT_DIR
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (folder / name).is_file():
            raise FileNotFoundError(
                f"digit classifier file {name!r} not found in {folder}; rebuild it with "
                f"`{REBUILD_COMMAND} --out {folder}`"
            )
    raw = json.loads((folder / CONFIG_FILE).read_text())
    if raw.pop("format", None) != FORMAT:
        raise ValueError(f"{folder / CONFIG_FILE} is not a {FORMAT} config")
    model = DigitClassifier(ClassifierConfig(**raw))
    model.load_state_dict(load_file(str(folder / WEIGHTS_FILE)), strict=True)
    return model.to(device).eval().requires_grad_(False)
