"""Score the embedded base model with the digit classifier and record it beside the model.

    python -m rewards.evaluate_base_model [--model DIR] [--seeds-per-prompt 32] [--steps 10]

Held-out prompts (and the training template) × fixed seeds, 10 Euler steps in full precision; the
reward (log p of the prompted digit) and the accuracy are merged into the model's
`model_metrics.json`, which `python -m diffusion.embedded.train` writes. A command of the reward
side: the diffusion core never imports a reward.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from diffusion.config import EMBEDDED_MODEL
from diffusion.embedded.data import TRAIN_TEMPLATES, heldout_prompts, prompt_for
from diffusion.loading import load_policy
from diffusion.noise import derive_seed
from rewards import build_reward


@torch.no_grad()
def evaluate(folder: Path, seeds_per_prompt: int = 32, steps: int = 10) -> dict[str, float]:
    """Reward and accuracy per prompt set: {train_template,heldout_template}_{reward,accuracy}."""
    policy = load_policy(folder)
    reward = build_reward("digit_alignment")
    out: dict[str, float] = {}
    for name, prompts in (("train_template", [prompt_for(d, TRAIN_TEMPLATES[0]) for d in range(10)]),
                          ("heldout_template", heldout_prompts())):
        all_prompts = [p for p in prompts for _ in range(seeds_per_prompt)]
        seeds = [derive_seed(0, -1, slot, j) for slot in range(len(prompts)) for j in range(seeds_per_prompt)]
        images = policy.decode(policy.sample(all_prompts, seeds, steps=steps).x0)
        out[f"{name}_reward"] = float(reward(images, all_prompts).mean())
        out[f"{name}_accuracy"] = float(reward.details(images, all_prompts)["accuracy"].mean())
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=EMBEDDED_MODEL)
    parser.add_argument("--seeds-per-prompt", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    scores = {k: round(v, 4) for k, v in evaluate(args.model, args.seeds_per_prompt, args.steps).items()}
    path = args.model.parent / "model_metrics.json"
    metrics = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**metrics, **scores}, indent=2) + "\n")
    print(json.dumps(scores, indent=2))


if __name__ == "__main__":
    main()
