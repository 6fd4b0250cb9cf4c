"""Rank fidelity of low-precision exploration (the paper's Table 8) on any model.

    python -m bench.rank_fidelity [--config FILE] [--prompts P] [--n 96] [--explore-steps 6]
                                  [--train-steps 10] [--precisions nvfp4,nvfp4_w4a16,fp8] --json FILE

For P prompts × N seeds: the reference is full precision at train steps (what the learner
regenerates); each variant samples the same seeds at explore steps — full precision
(`none_explore_steps`, the step effect alone) and every low precision (step + quantization effect).
Per prompt it compares the variant's rewards with the reference's: Spearman ρ, Kendall τ, top-K and
bottom-K hit rates (|top-K(variant) ∩ top-K(reference)| / K), then averages over prompts.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from cluster.config import load_config
from diffusion.loading import load_policy_from_config
from diffusion.quant import QUANTIZED_PRECISIONS
from learner.fidelity import format_table, measure
from rewards import build_reward_from_config


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/embedded.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--n", type=int, default=96)
    parser.add_argument("--explore-steps", type=int, default=6)
    parser.add_argument("--train-steps", type=int, default=10)
    parser.add_argument("--precisions", type=lambda s: s.split(","), default=list(QUANTIZED_PRECISIONS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.n < 13:
        parser.error("--n must be at least 13 (hit@12 needs more candidates than 12)")
    torch.set_num_threads(args.threads)
    config = load_config(args.config, args.set)
    policy = load_policy_from_config(config.model)
    reward = build_reward_from_config(config.reward)
    results = measure(config, policy, reward, args.prompts, args.n, args.explore_steps, args.train_steps,
                      args.precisions)
    print(format_table(results))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
