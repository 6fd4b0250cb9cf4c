"""digit_margin: the classifier's log-odds of the prompted digit — digit_alignment without its ceiling.

reward = z_d − logsumexp_{j ≠ d} z_j = log p_d − log(1 − p_d)      (z: logits, d: the prompted digit)

digit_alignment, log p_d, tends to 0 as a digit gets clean, so among good samples its differences vanish:
the best 12 of 96 candidates score hardly better than the best 12 of 24, and a larger pool buys little
(issue 12's measured reason for Sol-RL's thin margin on the embedded world). The log-odds ranks the samples
exactly as log p_d does (it is an increasing function of p_d) but keeps growing by about one unit per
halving of 1 − p_d, as the paper's rewards keep rising with quality. `details` adds `digit_alignment` (log p_d
of the same images), so one evaluation reports both rewards, plus the classifier's `accuracy`.
"""

from __future__ import annotations

import torch

from rewards.base import register_reward
from rewards.digit_alignment import DigitAlignment


@register_reward("digit_margin")
class DigitMargin(DigitAlignment):
    """Logit of the prompted digit minus the logsumexp of the other nine (unbounded, log-odds)."""

    def score_logits(self, logits: torch.Tensor, digits: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """z_d − logsumexp_{j ≠ d} z_j, and `digit_alignment` (log p_d) of the same images."""
        chosen = logits.gather(1, digits[:, None]).squeeze(1)
        others = logits.scatter(1, digits[:, None], float("-inf")).logsumexp(dim=1)
        log_p = torch.log_softmax(logits, dim=1).gather(1, digits[:, None]).squeeze(1)
        return chosen - others, {"digit_alignment": log_p}
