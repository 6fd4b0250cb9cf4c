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

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DECAY_TYPES: dict[int, tuple[int, float, float]] = {0: (0, 0.0, 0.0), 1: (0, 0.001, 0.5), 2: (75, 0.0075, 0.999)}


def nft_decay(step: int, flat: int, uprate: float, uphold: float) -> float:
    """d = 0 if step < flat else min((step − flat)·uprate, uphold)."""
    return 0.0 if step < flat else min((step - flat) * uprate, uphold)


def linear_decay(step: int, start: float, end: float, ramp_steps: int) -> float:
    """d = start + (end − start)·min(step / ramp_steps, 1)."""
    return start + (end - start) * min(step / max(ramp_steps, 1), 1.0)


class DecayConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal[0, 1, 2, 3, "linear"] = 1
    custom_steps: int = Field(0, ge=0, description="type 3 only: steps to reach custom_value")
    custom_value: float = Field(0.0, ge=0.0, le=1.0, description="type 3 only: the decay it holds")
    start: float = Field(0.0, ge=0.0, le=1.0, description="linear only")
    end: float = Field(0.5, ge=0.0, le=1.0, description="linear only")
    ramp_steps: int = Field(100, ge=1, description="linear only")

    @model_validator(mode="after")
    def _custom_needs_values(self) -> DecayConfig:
        if self.type == 3 and not (self.custom_steps > 0 and self.custom_value > 0):
            raise ValueError(
                f"decay type 3 (custom) needs custom_steps > 0 and custom_value > 0 (given "
                f"{self.custom_steps} and {self.custom_value}); e.g. learner.decay.custom_steps=100 "
                "learner.decay.custom_value=0.9"
            )
        return self

    def decay(self, step: int) -> float:
        """d for the soft update that follows optimizer step number `step` (1 for the first)."""
        if self.type == "linear":
            return linear_decay(step, self.start, self.end, self.ramp_steps)
        if self.type == 3:
            return nft_decay(step, 0, self.custom_value / self.custom_steps, self.custom_value)
        return nft_decay(step, *DECAY_TYPES[self.type])
