"""Train the digit classifier that scores the embedded world, deterministically on the CPU.

    python -m rewards.train_digit_classifier [--out DIR] [--steps N] [--seed S] [--threads T]

Trains on the "train" split of `diffusion.embedded.data` with light augmentation — each image is
shifted by a random whole pixel in {-1, 0, 1}² and gets Gaussian noise of a random strength in
[0, 0.1] — because the images it will score come from an imperfect generator, and a classifier
that has only seen clean, centred digits ranks those poorly. Fixed steps and a fixed seed
(`torch.manual_seed` plus a seeded generator for batches and augmentation, deterministic
algorithms on) and a fixed thread count (default 1) make a rerun give the same weights with the
same torch build and CPU kind.

Writes `config.json`, `model.safetensors` and `metrics.json` into DIR (default: the committed
artifact `rewards/artifacts/digit_classifier/`). Refuses to save a model whose held-out accuracy
is under --min-heldout-accuracy (default 0.97) and exits with status 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from diffusion.embedded.data import load_digit_images
from rewards.digit_classifier import (
    DEFAULT_DIR,
    METRICS_FILE,
    REBUILD_COMMAND,
    DigitClassifier,
    num_parameters,
    save_classifier,
)

MAX_NOISE = 0.1


def augment(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Shift each image by a random whole pixel in {-1, 0, 1}² (zero fill) and add light noise."""
    batch, _, height, width = images.shape
    padded = F.pad(images, (1, 1, 1, 1))
    shifts = torch.randint(0, 3, (batch, 2), generator=generator)
    out = torch.empty_like(images)
    for dy in range(3):
        for dx in range(3):
            chosen = (shifts[:, 0] == dy) & (shifts[:, 1] == dx)
            out[chosen] = padded[chosen, :, dy : dy + height, dx : dx + width]
    sigma = torch.rand(batch, 1, 1, 1, generator=generator) * MAX_NOISE
    noise = torch.randn(images.shape, generator=generator) * sigma
    return (out + noise).clamp_(0.0, 1.0)


@torch.inference_mode()
def accuracy(model: DigitClassifier, images: torch.Tensor, labels: torch.Tensor) -> float:
    model.eval()
    predictions = torch.cat([model(chunk).argmax(dim=1) for chunk in images.split(512)])
    return float((predictions == labels).float().mean())


def train(
    steps: int = 1500, seed: int = 0, batch_size: int = 128, lr: float = 3e-3, threads: int = 1
) -> tuple[DigitClassifier, dict]:
    """Train a fresh classifier; returns it (eval mode) and its metrics.

    The weights depend on the thread count (reductions split differently), so it is fixed and
    recorded. One thread is the default: the model is tiny, and on a busy machine more threads spin
    against the other load instead of helping (docs/benchmarks.md, "The embedded world").
    """
    was_threads = torch.get_num_threads()
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        start = time.perf_counter()
        torch.manual_seed(seed)
        generator = torch.Generator().manual_seed(seed)
        train_set = load_digit_images("train")
        heldout = load_digit_images("heldout")
        model = DigitClassifier()
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
        schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps)
        model.train()
        for _step in range(steps):
            index = torch.randint(0, len(train_set.labels), (batch_size,), generator=generator)
            images = augment(train_set.images[index], generator)
            loss = F.cross_entropy(model(images), train_set.labels[index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
        model.eval().requires_grad_(False)
        metrics = {
            "heldout_accuracy": accuracy(model, heldout.images, heldout.labels),
            "train_accuracy": accuracy(model, train_set.images, train_set.labels),
            "final_batch_loss": float(loss.detach()),
            "steps": steps,
            "seed": seed,
            "threads": threads,
            "batch_size": batch_size,
            "lr": lr,
            "parameters": num_parameters(model),
            "heldout_images": len(heldout.labels),
            "train_images": len(train_set.labels),
            "seconds": round(time.perf_counter() - start, 2),
            "torch": torch.__version__,
        }
        return model, metrics
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
        torch.set_num_threads(was_threads)


def _command(out: Path | None, steps: int, seed: int, threads: int) -> str:
    """The command line that reproduces this run; --out only when given, relative to the CWD if inside it."""
    parts = [REBUILD_COMMAND]
    if out is not None:
        resolved, cwd = out.resolve(), Path.cwd().resolve()
        parts += ["--out", str(resolved.relative_to(cwd)) if resolved.is_relative_to(cwd) else str(out)]
    parts += ["--steps", str(steps), "--seed", str(seed), "--threads", str(threads)]
    return " ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=None, help=f"output folder (default: {DEFAULT_DIR.name} artifact)"
    )
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the weights depend on it)")
    parser.add_argument("--min-heldout-accuracy", type=float, default=0.97)
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.threads < 1:
        parser.error("--threads must be at least 1")

    model, metrics = train(steps=args.steps, seed=args.seed, threads=args.threads)
    metrics["command"] = _command(args.out, args.steps, args.seed, args.threads)
    print(json.dumps(metrics, indent=2))
    if metrics["heldout_accuracy"] < args.min_heldout_accuracy:
        print(
            f"held-out accuracy {metrics['heldout_accuracy']:.4f} is under {args.min_heldout_accuracy}; "
            "not saving the classifier",
            file=sys.stderr,
        )
        return 1
    folder = save_classifier(model, args.out if args.out is not None else DEFAULT_DIR)
    (folder / METRICS_FILE).write_text(json.dumps(metrics, indent=2) + "\n")
    print(f"saved the classifier to {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
