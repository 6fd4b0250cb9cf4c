"""Score the embedded base model with the digit classifier and record it beside the model.

    python -m bench.base_model [--model DIR] [--seeds-per-prompt 32] [--steps 10]
    python -m bench.base_model --cfg-scales 1,1.5,2,4.5 [--json bench/results/base_model_cfg.json]

Held-out prompts (and the training template) × the evaluation's fixed seeds (run seed 0), sampled as
the embedded preset's evaluation samples (`learner.rollouts.evaluation_sampling`: Euler, full precision)
at `--steps`, through the one sample → decode → reward path; the reward (log p of the prompted digit)
and the accuracy are merged into the model's `model_metrics.json`, which `python -m diffusion.embedded.train`
writes.

With `--cfg-scales` it scores the same samples under classifier-free guidance against the empty prompt at each
scale instead (nothing is written beside the model): whether the embedded model can be guided at all, which
decides whether its Flow-GRPO baseline can sample at the source's CFG 4.5 (docs/objectives.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from bench.plan import CONFIGS
from cluster.config.loading import load_config
from diffusion.config import EMBEDDED_MODEL
from diffusion.embedded.data import TRAIN_TEMPLATES, heldout_prompts, prompt_for
from diffusion.loading import load_policy
from diffusion.noise import eval_seeds
from learner.rollouts import evaluation_sampling, generate
from rewards import build_reward


@torch.no_grad()
def evaluate(folder: Path, seeds_per_prompt: int = 32, steps: int = 10, cfg_scale: float = 1.0,
             reward_name: str = "digit_alignment") -> dict[str, float]:
    """Reward and accuracy per prompt set: {train_template,heldout_template}_{reward,accuracy}."""
    policy = load_policy(folder)
    reward = build_reward(reward_name)
    sampling = evaluation_sampling(load_config(CONFIGS / "embedded.yaml", [f"eval.steps={steps}",
                                                                           f"sampler.cfg_scale={cfg_scale}"]))
    out: dict[str, float] = {}
    for name, prompts in (("train_template", [prompt_for(d, TRAIN_TEMPLATES[0]) for d in range(10)]),
                          ("heldout_template", heldout_prompts())):
        all_prompts = [p for p in prompts for _ in range(seeds_per_prompt)]
        seeds = [s for slot in range(len(prompts)) for s in eval_seeds(0, slot, seeds_per_prompt)]
        scored = generate(policy, None, reward, all_prompts, seeds, sampling)
        out[f"{name}_reward"] = float(scored.rewards.mean())
        out[f"{name}_accuracy"] = float(scored.details["accuracy"].mean())
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=EMBEDDED_MODEL)
    parser.add_argument("--seeds-per-prompt", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cfg-scales", type=lambda s: [float(x) for x in s.split(",")], default=None,
                        help="score under CFG at each scale (digit_margin and log p), print and write --json")
    parser.add_argument("--json", type=Path, default=Path("bench/results/base_model_cfg.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.cfg_scales:
        rows = {}
        print("| CFG scale | held-out digit_margin | held-out log p | held-out accuracy |\n|---|---|---|---|")
        for scale in args.cfg_scales:
            margin = evaluate(args.model, args.seeds_per_prompt, args.steps, scale, "digit_margin")
            log_p = evaluate(args.model, args.seeds_per_prompt, args.steps, scale, "digit_alignment")
            rows[str(scale)] = {"digit_margin": margin["heldout_template_reward"],
                                "log_p": log_p["heldout_template_reward"],
                                "accuracy": log_p["heldout_template_accuracy"]}
            print(f"| {scale:g} | {rows[str(scale)]['digit_margin']:.3f} | {rows[str(scale)]['log_p']:.3f} | "
                  f"{rows[str(scale)]['accuracy']:.3f} |", flush=True)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"steps": args.steps, "seeds_per_prompt": args.seeds_per_prompt,
                                         "heldout": rows}, indent=2) + "\n")
        return
    scores = {k: round(v, 4) for k, v in evaluate(args.model, args.seeds_per_prompt, args.steps).items()}
    path = args.model.parent / "model_metrics.json"
    metrics = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**metrics, **scores}, indent=2) + "\n")
    print(json.dumps(scores, indent=2))


if __name__ == "__main__":
    main()
