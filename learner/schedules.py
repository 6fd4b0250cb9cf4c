"""How fast the sampling ("old") policy follows the trained one.

After each optimizer step: θ_old ← d·θ_old + (1 − d)·θ, with d from a schedule of the step count.
DiffusionNFT's schedule: d = 0 while step < flat, then min((step − flat)·uprate, uphold).
Types of the official code: 0 = fully on-policy (0, 0, 0); 1 = default (0, 0.001, 0.5);
2 = OCR (75, 0.0075, 0.999). `linear` ramps d from `start` to `end` over `ramp_steps` steps.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

DECAY_TYPES: dict[int, tuple[int, float, float]] = {0: (0, 0.0, 0.0), 1: (0, 0.001, 0.5), 2: (75, 0.0075, 0.999)}


def nft_decay(step: int, flat: int, uprate: float, uphold: float) -> float:
    """d = 0 if step < flat else min((step − flat)·uprate, uphold)."""
    return 0.0 if step < flat else min((step - flat) * uprate, uphold)


def linear_decay(step: int, start: float, end: float, ramp_steps: int) -> float:
    """d = start + (end − start)·min(step / ramp_steps, 1)."""
    return start + (end - start) * min(step / max(ramp_steps, 1), 1.0)


class DecayConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal[0, 1, 2, "linear"] = 1
    start: float = Field(0.0, ge=0.0, le=1.0, description="linear only")
    end: float = Field(0.5, ge=0.0, le=1.0, description="linear only")
    ramp_steps: int = Field(100, ge=1, description="linear only")

    def decay(self, step: int) -> float:
        if self.type == "linear":
            return linear_decay(step, self.start, self.end, self.ramp_steps)
        return nft_decay(step, *DECAY_TYPES[self.type])
