"""The learner's three views of one model, and its optimizer.

DiffusionNFT trains θ, samples with θ_old (a soft copy of θ: θ_old ← d·θ_old + (1 − d)·θ) and
regularises towards the reference (the base model). `TrainingState` owns the three views:

* LoRA mode (default): one transformer carries two peft LoRA adapters, "default" (θ, trained) and
  "old" (θ_old, frozen), initialised identical with B = 0 so that θ = θ_old = base at the start. The
  reference is the same transformer with its adapters disabled. Switching view only flips two
  attributes on each LoRA layer (no copies, no requires_grad changes).
* Full mode: θ is the transformer itself, all parameters trainable; θ_old and the reference are
  frozen deep copies (three copies of the weights in memory).

Use a view with ``with state.use("theta" | "old" | "reference") as model:`` and pass `model` to
`FlowPolicy.velocity(..., transformer=model)`. "old" and "reference" blocks run under
`torch.no_grad()` (set by the context manager), so their forwards never build a graph.

With `config.gradient_checkpointing` the trained transformer (the LoRA-carrying one, or θ in full
mode) runs diffusers' gradient checkpointing: its blocks keep only their inputs and recompute the
rest in the backward pass. In LoRA mode the recomputation runs whatever view is active at backward
time, so a loss built under "theta" must be backpropagated under "theta" (`nft_update`/`art_update`
do so inside their `use("theta")` block; `step(loss)` refuses another view).
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Literal

import torch
from torch import nn

from diffusion.device import module_device
from learner.config import TrainingConfig
from learner.ema import ParameterEMA
from learner.lora_adapters import ADAPTERS, enable_gradient_checkpointing, inject_adapters, merged_lora

if TYPE_CHECKING:
    from diffusion.policy import FlowPolicy

View = Literal["theta", "old", "reference"]
VIEWS: tuple[str, ...] = ("theta", "old", "reference")


class TrainingState:
    """θ, θ_old, the reference and the AdamW optimizer of θ.

    `transformer` is modified in place (LoRA mode injects adapters; full mode makes it trainable).
    `family_targets` are the LoRA target module suffixes used when `config.lora_targets` is None
    (`policy.family.lora_targets`). `seed` fixes the LoRA A initialisation (B starts at zero); the
    global torch RNG is left as it was.
    """

    def __init__(
        self,
        transformer: nn.Module,
        config: TrainingConfig | None = None,
        *,
        family_targets: Sequence[str] | None = None,
        seed: int = 0,
    ) -> None:
        self.config = config or TrainingConfig()
        self.transformer = transformer
        self.mode = self.config.mode
        self.device = module_device(transformer)
        self.skipped_steps = 0
        self._view: str = "theta"
        self._base_keys = list(transformer.state_dict().keys())
        self.lora_targets: list[str] | None = None
        if self.mode == "lora":
            targets = self.config.lora_targets if self.config.lora_targets is not None else family_targets
            if not targets:
                raise ValueError("LoRA mode needs target modules: set lora_targets or pass the family's targets")
            self.lora_targets = list(targets)
            self._layers, self._theta, self._old = inject_adapters(transformer, self.config, self.lora_targets,
                                                                   self.device, seed)
            self._set_view("theta")
            if list(self._merged_lora("old").keys()) != self._base_keys:
                raise RuntimeError("LoRA injection changed the transformer's keys in an unexpected way")
        else:
            self._init_full()
        if self.config.gradient_checkpointing:
            enable_gradient_checkpointing(transformer)
        self.ema = ParameterEMA(self._theta, self.config.ema_decay, self.config.ema_every or 1) if self.config.ema \
            else None
        self.optimizer = torch.optim.AdamW(
            list(self._theta.values()),
            lr=self.config.lr,
            betas=self.config.betas,
            weight_decay=self.config.weight_decay,
            eps=self.config.eps,
        )

    @classmethod
    def from_policy(cls, policy: FlowPolicy, config: TrainingConfig | None = None, *, seed: int = 0) -> TrainingState:
        """A state on `policy.transformer`, with the policy's family LoRA targets as the default."""
        return cls(policy.transformer, config, family_targets=policy.family.lora_targets, seed=seed)

    @property
    def lora_scale(self) -> float:
        """The factor of B @ A in each adapted weight (peft's scaling, not rsLoRA): lora_alpha / lora_rank.
        A `lora` weight-sync snapshot carries it, for the explorers' merge."""
        return self.config.lora_alpha / self.config.lora_rank

    def _init_full(self) -> None:
        transformer = self.transformer
        transformer.requires_grad_(False)
        self.old_model = copy.deepcopy(transformer)
        self.reference_model = copy.deepcopy(transformer)
        transformer.requires_grad_(True)
        self._theta = dict(transformer.named_parameters())
        self._old = dict(self.old_model.named_parameters())

    # ---- views ---------------------------------------------------------------------------------
    @property
    def view(self) -> str:
        """The innermost active `use` view; 'theta' outside any. In LoRA mode a plain call of
        `transformer` computes this view."""
        return self._view

    def _set_view(self, view: str) -> None:
        self._view = view
        if self.mode != "lora":
            return
        for _, layer in self._layers:
            if view == "reference":
                layer._disable_adapters = True
            else:
                layer._disable_adapters = False
                layer._active_adapter = [ADAPTERS[view]]

    def model(self, view: View) -> nn.Module:
        """The module that computes `view` (LoRA mode: the shared transformer; switch with `use`)."""
        if view not in VIEWS:
            raise ValueError(f"unknown view {view!r}; expected one of {VIEWS}")
        if self.mode == "lora" or view == "theta":
            return self.transformer
        return self.old_model if view == "old" else self.reference_model

    @contextlib.contextmanager
    def use(self, view: View) -> Iterator[nn.Module]:
        """Yield the module computing `view`; the previous view is restored on exit.

        'old' and 'reference' run under torch.no_grad() for the whole block.
        """
        model = self.model(view)
        previous = self._view
        self._set_view(view)
        try:
            with contextlib.nullcontext() if view == "theta" else torch.no_grad():
                yield model
        finally:
            self._set_view(previous)

    @contextlib.contextmanager
    def evaluated(self) -> Iterator[nn.Module]:
        """θ as evaluation sees it: its EMA when `config.ema`, else θ itself; under no_grad. θ's own
        values return on exit, bit for bit."""
        with self.use("theta") as model, torch.no_grad():
            if self.ema is None:
                yield model
            else:
                with self.ema.applied(self._theta):
                    yield model

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16 autocast on CUDA; a no-op elsewhere (CPU runs in the weights' dtype)."""
        if self.device.type == "cuda":
            return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # ---- parameters ----------------------------------------------------------------------------
    def theta_parameters(self) -> dict[str, nn.Parameter]:
        """θ's trainable parameters by canonical name (LoRA: without the adapter segment)."""
        return dict(self._theta)

    def old_parameters(self) -> dict[str, nn.Parameter]:
        """θ_old's parameters, same names and order as `theta_parameters`."""
        return dict(self._old)

    # ---- updates -------------------------------------------------------------------------------
    def step(self, loss: torch.Tensor | None) -> float:
        """Backward `loss` (None: gradients are already accumulated), clip, AdamW step, zero grads.

        Returns the total gradient norm before clipping. A non-finite loss or norm skips the update
        (gradients are dropped) and counts in `skipped_steps`. A step taken folds θ into the EMA with the
        number of steps taken (`ParameterEMA.update`: every step, or every n-th).
        """
        finite_loss = True
        if loss is not None and self.config.gradient_checkpointing and self.mode == "lora" and self._view != "theta":
            # The checkpointed blocks would be recomputed with this view's adapters: wrong gradients.
            raise RuntimeError(f"backward under view {self._view!r} with gradient checkpointing: call step "
                               "outside any `use` block or inside use('theta')")
        if loss is not None:
            finite_loss = bool(torch.isfinite(loss.detach()).all())
            loss.backward()
        params = list(self._theta.values())
        norm = torch.nn.utils.clip_grad_norm_(params, self.config.grad_clip)
        value = float(norm)
        if finite_loss and math.isfinite(value):
            self.optimizer.step()
            self.update_ema(self.optimizer_steps)
        else:
            self.skipped_steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        return value

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps taken (AdamW's own count, which checkpoints keep): the official loops' global_step."""
        return max((int(st["step"]) for st in self.optimizer.state.values() if "step" in st), default=0)

    def update_ema(self, step: int) -> None:
        """Fold θ into its EMA after optimizer step number `step` (1 for the first); no-op without one."""
        if self.ema is not None:
            self.ema.update(self._theta, step)

    def skip_step(self) -> None:
        """Count a skipped update and drop whatever gradients were accumulated."""
        self.skipped_steps += 1
        self.optimizer.zero_grad(set_to_none=True)

    @torch.no_grad()
    def soft_update(self, decay: float) -> None:
        """θ_old ← decay·θ_old + (1 − decay)·θ, in place (decay 0: copy θ exactly; 1: no change)."""
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"decay must be in [0, 1], got {decay}")
        if decay == 1.0:
            return
        old = list(self._old.values())
        theta = [p.detach() for p in self._theta.values()]
        if decay == 0.0:
            for target, source in zip(old, theta, strict=True):
                target.copy_(source)
            return
        torch._foreach_mul_(old, decay)
        torch._foreach_add_(old, theta, alpha=1.0 - decay)

    # ---- explorer weights ----------------------------------------------------------------------
    @torch.no_grad()
    def merged_weights(self, view: View = "theta") -> dict[str, torch.Tensor]:
        """θ, θ_old or the reference (the base model) as a plain transformer state dict (fresh or frozen
        tensors)."""
        if view not in VIEWS:
            raise ValueError(f"merged_weights takes one of {VIEWS}, got {view!r}")
        if self.mode == "full":
            model = {"theta": self.transformer, "old": self.old_model, "reference": self.reference_model}[view]
            return {k: v.detach() for k, v in model.state_dict().items()}
        return self._merged_lora(view)

    def _merged_lora(self, view: str) -> dict[str, torch.Tensor]:
        return merged_lora(self.transformer, self._layers, ADAPTERS.get(view), self._base_keys)

    def sampling_weights(self) -> dict[str, torch.Tensor]:
        """θ_old as a plain transformer state dict (the base's keys, shapes and dtypes): what the explore
        engines sample with. LoRA: W + lora_scale·B_old@A_old on the adapted weights (fresh tensors),
        the frozen base tensors elsewhere. Full mode: θ_old's own tensors, which the next `soft_update`
        overwrites in place — copy them if they must outlive it."""
        return self.merged_weights("old")
