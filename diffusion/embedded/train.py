"""Train the embedded base model with the rectified-flow objective and save it as a model folder.

    python -m diffusion.embedded.train [--out DIR] [--steps N] [--seed S]
    python -m bench.base_model        # then: its held-out reward, into model_metrics.json

Objective (rectified flow, SD3's logit-normal σ): x0 ~ data, ε ~ N(0, I), σ = sigmoid(n), n ~ N(0, 1),
x_σ = (1 − σ)·x0 + σ·ε,  loss = ‖v_θ(x_σ, σ, c) − (ε − x0)‖².
The text encoder trains jointly. The number of optimizer steps and the seed are fixed, not the wall
time, and deliberately small: the base model must be imperfect (about half of its 10-step samples
show the prompted digit) so that RL has headroom. The run is deterministic on CPU.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from diffusion.embedded.data import TRAIN_TEMPLATES, load_digit_images, prompt_for
from diffusion.embedded.model import build_text_encoder, build_tokenizer, build_transformer, save_model_folder
from diffusion.families import SD3
from diffusion.progress import Progress

ARTIFACTS = Path(__file__).parent / "artifacts"
DEFAULT_OUT = ARTIFACTS / "model"


def train(steps: int, seed: int, batch_size: int, lr: float) -> tuple:
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    tokenizer = build_tokenizer()
    text_encoder = build_text_encoder(tokenizer)
    transformer = build_transformer()
    components = {"tokenizer": tokenizer, "text_encoder": text_encoder, "transformer": transformer}
    params = list(transformer.parameters()) + list(text_encoder.parameters())
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    data = load_digit_images("train")
    losses, progress = [], Progress("step", steps)
    for step in range(steps):
        idx = torch.randint(len(data.labels), (batch_size,), generator=generator)
        template = torch.randint(len(TRAIN_TEMPLATES), (batch_size,), generator=generator)
        prompts = [prompt_for(int(d), TRAIN_TEMPLATES[int(t)]) for d, t in zip(data.labels[idx], template, strict=True)]
        x0 = data.images[idx] * 2.0 - 1.0
        eps = torch.randn(x0.shape, generator=generator)
        sigma = torch.sigmoid(torch.randn(batch_size, generator=generator))
        s = sigma.view(-1, 1, 1, 1)
        x_t = (1.0 - s) * x0 + s * eps
        v = SD3.velocity(transformer, x_t, sigma, SD3.encode(components, prompts))
        loss = torch.nn.functional.mse_loss(v, eps - x0)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        losses.append(loss.item())
        if step % 20 == 0 or step == steps - 1:
            print(f"{progress.line(step + 1)}  loss {loss.item():.4f}", flush=True)
    return transformer.eval(), text_encoder.eval(), tokenizer, losses


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--steps", type=int, default=225)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--threads", type=int, default=2, help="CPU threads; results depend on it")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)

    start = time.perf_counter()
    transformer, text_encoder, tokenizer, losses = train(args.steps, args.seed, args.batch_size, args.lr)
    seconds = time.perf_counter() - start
    save_model_folder(args.out, transformer, text_encoder, tokenizer)
    metrics = {
        "command": (
            f"python -m diffusion.embedded.train --steps {args.steps} --seed {args.seed} "
            f"--batch-size {args.batch_size} --lr {args.lr} --threads {args.threads}"
        ),
        "steps": args.steps,
        "seed": args.seed,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "threads": args.threads,
        "torch": torch.__version__,
        "train_seconds": round(seconds, 1),
        "final_loss": round(sum(losses[-10:]) / min(10, len(losses)), 4),
        "transformer_parameters": sum(p.numel() for p in transformer.parameters()),
        "text_encoder_parameters": sum(p.numel() for p in text_encoder.parameters()),
    }
    (args.out.parent / "model_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print(json.dumps(metrics, indent=2))
    print("score it with the digit classifier: python -m bench.base_model")


if __name__ == "__main__":
    main()
