"""Bytes of one prompt slot's images on their way to a scorer actor: float32 against uint8.

    python -m bench.scorer_payload [--json bench/results/scorer_payload.json]

An explorer (or the learner) with `cluster.scorers.count > 0` sends each slot's decoded images to a
RewardScorer: uint8 when every configured reward declares `reads_uint8` (pickscore, aesthetic, imagereward,
ocr, jpeg_compressibility: each rounds to 8 bits first, so the scores are bitwise those of the floats), else
float32 (clipscore, hpsv2, digit_alignment, digit_margin, geneval read the floats). Two measurements:

- bytes per slot of N = 96 candidates, for the presets' image sizes, the tiny families' and the embedded
  world's: `RemoteReward`'s payload (`rewards.uint8_images.image_payload`) built from random images of
  that shape, its `nbytes`, and the CPU seconds to build it (median of 3);
- what uint8 would change for a reward that reads floats, where a real model is at hand: the embedded
  world's digit classifier (`digit_alignment`) on the base model's 96 candidates of each of 4 prompts at the
  explore steps, scored from the floats and from their 8-bit rounding: the largest change, and whether the
  ranking and the best/worst selection the learner makes (K = 24) stay the same.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from rewards.uint8_images import from_uint8, image_payload, to_uint8

CANDIDATES = 96
SHAPES = {  # a slot's decoded images: [N, C, H, W]
    "SD3.5-L / SANA, 1024 px RGB": (CANDIDATES, 3, 1024, 1024),
    "FLUX.1-dev / SD3.5-M, 512 px RGB": (CANDIDATES, 3, 512, 512),
    "tiny families (tests), 32 px RGB": (CANDIDATES, 3, 32, 32),
    "embedded, 16 px grey": (CANDIDATES, 1, 16, 16),
}


def payload_row(shape: tuple[int, ...], repeats: int = 3) -> dict[str, float]:
    """float32 and uint8 payload bytes of random images of `shape`, and the seconds to build each."""
    images = torch.rand(shape, generator=torch.Generator().manual_seed(0))
    row: dict[str, float] = {}
    for name, uint8 in (("float32", False), ("uint8", True)):
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            payload = image_payload(images, uint8)
            seconds.append(time.perf_counter() - start)
        row[f"{name}_bytes"] = payload.nbytes
        row[f"{name}_s"] = statistics.median(seconds)
        del payload
    return row


def best_worst(order: torch.Tensor, keep: int) -> set[int]:
    """The candidates best_worst selection keeps from an ascending order: K/2 at each end."""
    return set(order[: keep // 2].tolist()) | set(order[len(order) - keep // 2 :].tolist())


def digit_alignment_under_uint8(prompts: int = 4, keep: int = 24) -> dict[str, float]:
    """The embedded base model's candidates scored by digit_alignment from floats and from 8 bits."""
    from cluster.config.loading import load_config
    from diffusion.loading import load_policy_from_config
    from diffusion.noise import candidate_seeds
    from diffusion.prompts import load_prompt_set
    from rewards import build_reward

    config = load_config("configs/embedded.yaml")
    policy, reward = load_policy_from_config(config.model), build_reward("digit_alignment")
    texts = load_prompt_set(config.prompts.source).texts[:prompts]
    largest, ranks_same, selections_same = 0.0, 0, 0
    for slot, prompt in enumerate(texts):
        seeds = candidate_seeds(config.run.seed, 0, slot, CANDIDATES)
        images = policy.decode(policy.sample([prompt] * CANDIDATES, seeds, steps=config.explore.steps).x0)
        floats = reward(images, [prompt] * CANDIDATES)
        bytes8 = reward(from_uint8(to_uint8(images)), [prompt] * CANDIDATES)
        largest = max(largest, float((floats - bytes8).abs().max()))
        order_f, order_8 = floats.argsort(stable=True), bytes8.argsort(stable=True)
        ranks_same += int(torch.equal(order_f, order_8))
        selections_same += int(best_worst(order_f, keep) == best_worst(order_8, keep))
    return {"prompts": len(texts), "candidates": CANDIDATES, "max_abs_change": largest,
            "rankings_unchanged": ranks_same, "best_worst_selections_unchanged": selections_same, "keep": keep}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = {}
    print(f"| slot of {CANDIDATES} | float32 | uint8 | ratio | build float32 s | build uint8 s |\n"
          "|---|---|---|---|---|---|")
    for name, shape in SHAPES.items():
        rows[name] = {"shape": list(shape), **payload_row(shape)}
        r = rows[name]
        print(f"| {name} | {r['float32_bytes']:,} B | {r['uint8_bytes']:,} B | "
              f"{r['float32_bytes'] / r['uint8_bytes']:.0f}× | {r['float32_s']:.3f} | {r['uint8_s']:.3f} |", flush=True)
    digits = digit_alignment_under_uint8()
    print(f"digit_alignment from 8 bits instead of floats ({digits['prompts']} prompts × {digits['candidates']} "
          f"candidates of the embedded base model): largest change {digits['max_abs_change']:.3g}; ranking "
          f"unchanged in {digits['rankings_unchanged']}/{digits['prompts']}, best/worst {digits['keep']} "
          f"unchanged in {digits['best_worst_selections_unchanged']}/{digits['prompts']}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"payloads": rows, "digit_alignment_under_uint8": digits}, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
