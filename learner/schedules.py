"""How fast the sampling ("old") policy follows the trained one.

After each optimizer step: θ_old ← d·θ_old + (1 − d)·θ, with d from a schedule of the step count s
*after* that step's increment (s = 1 after the first update), as the official loop calls
`return_decay(global_step, …)` once `global_step` has been incremented (NVlabs/Sana
`train_scripts/train_utils.py` `return_decay`; `train_scripts/sol_rl/train_sd3.py`).
DiffusionNFT's schedule: d = 0 while s < flat, then min((s − flat)·uprate, uphold). Types of the
official code: 0 = fully on-policy (0, 0, 0); 1 = default (0, 0.001, 0.5); 2 = OCR (75, 0.0075, 0.999);
3 = custom (0, value/steps, value): a linear ramp to `custom_value` over `custom_steps`.
`linear` ramps d from `start` to `end` over `ramp_steps` steps (this project's).
"""

from __future__ import annotations

DECAY_TYPES: dict[int, tuple[int, float, float]] = {0: (0, 0.0, 0.0), 1: (0, 0.001, 0.5), 2: (75, 0.0075, 0.999)}


def nft_decay(step: int, flat: int, uprate: float, uphold: float) -> float:
    """d = 0 if step < flat else min((step − flat)·uprate, uphold)."""
    return 0.0 if step < flat else min((step - flat) * uprate, uphold)


def linear_decay(step: int, start: float, end: float, ramp_steps: int) -> float:
    """d = start + (end − start)·min(step / ramp_steps, 1)."""
    return start + (end - start) * min(step / max(ramp_steps, 1), 1.0)
