"""An exponential moving average of θ's trainable parameters, for evaluation.

After optimizer step number s (1 for the first, counted after the increment as the official loop
does), when (s + 1) is a multiple of the interval n: e ← e + (1 − d_s)·(θ − e), d_s = min((1 + s)/(10 + s),
decay) — a warm-up that trusts early steps, then a fixed decay (0.9 in the papers' configs). n = 1 for
DiffusionNFT and Sol-RL, 8 for Flow-GRPO. (NVlabs/DiffusionNFT `flow_grpo/ema.py` `EMAModuleWrapper.step`
with its `update_step_interval`, called after `global_step += 1` in `train_scripts/sol_rl/train_sd3.py`;
yifan123/flow_grpo `scripts/train_sd3.py` builds it with update_step_interval=8 and calls it once per
training batch, so a step whose s + 1 is a multiple of 8 folds θ in once per batch since the previous
optimizer step, where this class folds it in once.)
Evaluation swaps e into θ's parameters and back (`applied`), as the official `copy_ema_to` /
`copy_temp_to` pair does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import torch


def ema_decay(step: int, cap: float) -> float:
    """d_s = min((1 + s)/(10 + s), cap)."""
    return min((1 + step) / (10 + step), cap)


class ParameterEMA:
    """The average `e` of named parameters; holds its own float copies (never aliases θ)."""

    def __init__(self, parameters: Mapping[str, torch.Tensor], decay: float, every: int = 1) -> None:
        if every < 1:
            raise ValueError(f"the EMA's interval must be >= 1 optimizer step, got {every}")
        self.decay, self.every = decay, every
        self.average = {name: p.detach().clone() for name, p in parameters.items()}

    @torch.no_grad()
    def update(self, parameters: Mapping[str, torch.Tensor], step: int) -> None:
        """e ← e + (1 − d_s)·(θ − e) after optimizer step `step`, when (step + 1) mod every = 0."""
        if (step + 1) % self.every:
            return
        weight = 1.0 - ema_decay(step, self.decay)
        for name, average in self.average.items():
            average.add_(parameters[name].detach() - average, alpha=weight)

    @contextlib.contextmanager
    def applied(self, parameters: Mapping[str, torch.Tensor]) -> Iterator[None]:
        """Inside, `parameters` hold e; on exit their own values return, bit for bit."""
        with torch.no_grad():
            saved = {name: p.detach().clone() for name, p in parameters.items()}
            for name, p in parameters.items():
                p.copy_(self.average[name])
        try:
            yield
        finally:
            with torch.no_grad():
                for name, p in parameters.items():
                    p.copy_(saved[name])
