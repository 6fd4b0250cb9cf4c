"""The update phase of each objective: advantages from rewards, then the optimizer step(s).

    objective  advantages                                   update
    nft        per-prompt centred, globally scaled (mode)   one step of the NFT loss on re-noised x0
    art        raw rewards (or pairwise winner/loser)       two steps, one per window, on visited states
    flow_grpo  per-prompt centred, globally scaled (mode)   one step of PPO-clip on the SDE rollout's steps

Each is an `ObjectiveSpec` in `OBJECTIVES`; the trainer calls `spec.advantages` then `spec.update`.
A micro-batch whose loss is NaN or ±inf is dropped (no backward; the official loop zeroes that loss,
NVlabs/Sana `train_scripts/sol_rl/train_sd3.py`), the others still update; an update whose every
micro-batch was dropped is skipped. Random choices come from the iteration's named seed streams.

In a learner group (`learner.data_parallel`) an update sees its rank's slots only: draws that span the
batch are made for the whole batch and sliced, loss weights are shares of the whole batch, and the
gradients are summed over the ranks before the step.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from diffusion.noise import Stream, stream_generator
from diffusion.policy import FlowPolicy
from diffusion.samplers import Solver, flow_sde_transition, gaussian_log_prob
from learner.advantages import compute_advantages
from learner.art import art_guidance, art_loss, art_target, pairwise_scores, split_windows
from learner.config import LearnerConfig
from learner.data_parallel import ALONE, Shard
from learner.flow_grpo import flow_grpo_loss
from learner.objectives import nft_loss, trained_timestep_indices
from learner.rollouts import Group
from learner.training_state import TrainingState


@dataclass
class UpdateContext:
    """What an update reads: the model, its training state, the settings, the iteration's seeds."""

    policy: FlowPolicy
    state: TrainingState
    learner: LearnerConfig
    sigmas: torch.Tensor  # the regeneration sampler's σ grid (steps + 1)
    run_seed: int
    iteration: int
    slots: list[int]  # the batch slot of each group the update sees (this rank's, in a learner group)
    batch_slots: int  # slots in the whole batch
    shard: Shard = ALONE
    sde_noise_level: float = 0.7  # the flow_sde solver's a (`sampler.sde_noise_level`)
    passes: int = 0  # per-sample model passes so far: a forward counts 1, a forward with its backward 3

    def generator(self, stream: Stream, index: int = 0) -> torch.Generator:
        return stream_generator(self.run_seed, self.iteration, stream, index)

    def velocity(self, model: nn.Module, x: torch.Tensor, sigma: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        dev, cond = self.policy.device, self.policy.encode(prompts)
        # The cost model of bench.convergence charges training by these (a backward ≈ two forwards).
        self.passes += x.shape[0] * (3 if torch.is_grad_enabled() else 1)
        with self.state.autocast():
            return self.policy.velocity(x.to(dev), sigma.to(dev), cond, transformer=model).float()


class MicroBatches:
    """Accumulates weighted micro-batch losses into θ's gradients, dropping non-finite ones."""

    def __init__(self, state: TrainingState, shard: Shard = ALONE) -> None:
        self.state, self.shard, self.total, self.kept, self.dropped = state, shard, 0.0, 0, 0

    def backward(self, loss: torch.Tensor, weight: float) -> None:
        if not bool(torch.isfinite(loss.detach()).all()):
            self.dropped += 1
            return
        (loss * weight).backward()
        self.total += float(loss.detach()) * weight
        self.kept += 1

    def step(self) -> float:
        """The optimizer step (gradient norm) on the whole batch's gradient, or a skipped one when every
        micro-batch of every rank was dropped. The loss and the counts become the whole batch's."""
        whole = self.shard.sum({"kept": self.kept, "dropped": self.dropped, "total": self.total})
        self.kept, self.dropped, self.total = int(whole["kept"]), int(whole["dropped"]), whole["total"]
        if self.kept == 0:
            self.state.skip_step()
            return math.nan
        self.shard.sum_gradients(list(self.state.theta_parameters().values()))
        return self.state.step(None)


def nft_advantages(rewards: torch.Tensor, learner: LearnerConfig) -> torch.Tensor:
    return compute_advantages(rewards, learner.advantage_mode)


def nft_update(ctx: UpdateContext, groups: list[Group], advantages: torch.Tensor) -> dict[str, float]:
    """One optimizer step of DiffusionNFT over every kept sample at a share of the sampler's timesteps."""
    cfg, nft, dev = ctx.learner, ctx.learner.nft, ctx.policy.device
    advantages = advantages.flatten()
    x0 = torch.cat([g.samples.x0 for g in groups])
    prompts = [g.prompt for g in groups for _ in range(g.samples.x0.shape[0])]
    keep = groups[0].samples.x0.shape[0]
    rows = torch.cat([torch.arange(s * keep, (s + 1) * keep) for s in ctx.slots])  # in the whole batch
    whole = (ctx.batch_slots * keep, *x0.shape[1:])
    sigmas = ctx.sigmas[:-1]  # the sampler's own timesteps
    idx = trained_timestep_indices(whole[0], len(sigmas), cfg.timestep_fraction, ctx.generator(Stream.TIMESTEPS))
    batches, count = MicroBatches(ctx.state, ctx.shard), idx.numel()
    idx, noise_g = idx[rows], ctx.generator(Stream.TRAIN_NOISE)
    for j in range(idx.shape[1]):
        t = sigmas[idx[:, j]]
        eps = torch.randn(whole, generator=noise_g)[rows]
        x_t = (1 - t.view(-1, 1, 1, 1)) * x0 + t.view(-1, 1, 1, 1) * eps
        for s in range(0, len(x0), cfg.micro_batch):
            mb = slice(s, s + cfg.micro_batch)
            t_mb = t[mb].to(dev)
            with ctx.state.use("old") as model:
                v_old = ctx.velocity(model, x_t[mb], t_mb, prompts[mb])
            with ctx.state.use("reference") as model:
                v_ref = ctx.velocity(model, x_t[mb], t_mb, prompts[mb])
            with ctx.state.use("theta") as model:
                v_theta = ctx.velocity(model, x_t[mb], t_mb, prompts[mb])
                loss = nft_loss(v_theta, v_old, v_ref, x_t[mb].to(dev), x0[mb].to(dev), t_mb,
                                advantages[mb].to(dev), beta=nft.beta, adv_clip_max=nft.adv_clip_max,
                                kl_weight=nft.kl_weight)
                batches.backward(loss, t_mb.shape[0] / count)
    grad_norm = batches.step()
    return {"loss": batches.total, "grad_norm": grad_norm, "dropped_micro_batches": batches.dropped}


def art_advantages(rewards: torch.Tensor, learner: LearnerConfig) -> torch.Tensor:
    return pairwise_scores(rewards) if learner.art.pairwise else rewards


def _art_windows(ctx: UpdateContext, groups: list[Group], scores: torch.Tensor) -> list[dict[str, Any]]:
    """Each prompt's K samples split into two disjoint windows; per window the visited states at the
    trained timesteps, their σ and step, the prompt's guidance G(c) from its full group, and how many
    entries the window has in the whole batch (the splits and timesteps of every slot are drawn on every
    rank, in slot order, so each slot's draws do not depend on the ranks)."""
    mine = {slot: i for i, slot in enumerate(ctx.slots)}
    guidance = [art_guidance(g.samples.x0, scores[i]) for i, g in enumerate(groups)]
    sigmas, idx_g, keep = ctx.sigmas, ctx.generator(Stream.TIMESTEPS), groups[0].samples.x0.shape[0]
    splits = [split_windows(keep, ctx.generator(Stream.WINDOWS, slot)) for slot in range(ctx.batch_slots)]
    windows = []
    for w in range(2):
        xs, ts, dts, gs, prompts, count = [], [], [], [], [], 0
        for slot in range(ctx.batch_slots):
            members = splits[slot][w]
            idx = trained_timestep_indices(len(members), len(sigmas) - 1, ctx.learner.timestep_fraction, idx_g)
            count += idx.numel()
            if slot not in mine:
                continue
            i = mine[slot]
            g = groups[i]
            for row, k in enumerate(members.tolist()):
                for step in idx[row].tolist():  # states the reverse ODE rollout visited
                    xs.append(g.samples.states[step][k])
                    ts.append(sigmas[step])
                    dts.append(sigmas[step + 1] - sigmas[step])
                    gs.append(guidance[i])
                    prompts.append(g.prompt)
        windows.append({"x_t": torch.stack(xs), "t": torch.stack(ts), "dt": torch.stack(dts),
                        "guide": torch.stack(gs), "prompts": prompts, "count": count})
    return windows


def art_update(ctx: UpdateContext, groups: list[Group], scores: torch.Tensor) -> dict[str, float]:
    """DiffusionART (docs/objectives.md): a frozen target v* = v_old − G(c) on visited states, two disjoint
    windows per prompt, one step each; the second replays the frozen target after the first moved θ."""
    cfg, art, dev = ctx.learner, ctx.learner.art, ctx.policy.device
    windows = _art_windows(ctx, groups, scores)
    # The target is frozen before any update, from the reference policy: the sampling policy θ_old, which is θ
    # at the iteration's start (ART runs with decay 0), and the anchor of the trust mask and restoration.
    for win in windows:
        with ctx.state.use("old") as model, torch.no_grad():
            v_ref = torch.cat([ctx.velocity(model, win["x_t"][s:s + cfg.micro_batch], win["t"][s:s + cfg.micro_batch],
                                            win["prompts"][s:s + cfg.micro_batch])
                               for s in range(0, len(win["prompts"]), cfg.micro_batch)])
        win["target"] = art_target(v_ref, win["guide"].to(dev), art.guidance_scale)
    metrics: dict[str, float] = {"dropped_micro_batches": 0}
    for w, (win, restore) in enumerate(zip(windows, (0.0, art.restore_weight), strict=True)):
        count, batches = win["count"], MicroBatches(ctx.state, ctx.shard)
        for s in range(0, len(win["prompts"]), cfg.micro_batch):
            mb = slice(s, s + cfg.micro_batch)
            t_mb = win["t"][mb].to(dev)
            with ctx.state.use("old") as model:  # the sampling policy: the restoration's anchor
                v_old = ctx.velocity(model, win["x_t"][mb], t_mb, win["prompts"][mb])
            with ctx.state.use("theta") as model:
                v_theta = ctx.velocity(model, win["x_t"][mb], t_mb, win["prompts"][mb])
                loss, diag = art_loss(v_theta, win["target"][mb], v_old, t_mb, win["dt"][mb].to(dev),
                                      restore_weight=restore, threshold=art.trust_threshold,
                                      noise_level=art.noise_level)
                batches.backward(loss, t_mb.shape[0] / count)
            metrics[f"window{w + 1}_masked_fraction"] = float(diag["masked_fraction"])
        metrics[f"window{w + 1}_grad_norm"] = batches.step()  # first: the step makes the loss the batch's
        metrics[f"window{w + 1}_loss"] = batches.total
        metrics["dropped_micro_batches"] += batches.dropped
    metrics["loss"] = metrics["window1_loss"] + metrics["window2_loss"]
    return metrics


def grpo_update(ctx: UpdateContext, groups: list[Group], advantages: torch.Tensor) -> dict[str, float]:
    """One optimizer step of Flow-GRPO (`learner.flow_grpo`) over every sample's trained SDE steps: a share
    of the rollout's steps, shuffled per sample (as the NFT update picks its timesteps). The rollout came
    from θ_old through the flow_sde solver; config validation holds decay at 0, so θ_old is θ at this
    step and log π_old is log π_θ detached (the source records it while sampling; recomputing it would
    be one more forward for the same number). With one step per iteration the ratio is 1 and the clip
    does not bind, as in the first step of each of the source's epochs."""
    cfg, grpo, dev = ctx.learner, ctx.learner.grpo, ctx.policy.device
    advantages = advantages.flatten()
    states = torch.stack([torch.cat([g.samples.states[k] for g in groups]) for k in range(len(ctx.sigmas))])
    prompts = [g.prompt for g in groups for _ in range(g.samples.x0.shape[0])]
    keep = groups[0].samples.x0.shape[0]
    rows = torch.cat([torch.arange(s * keep, (s + 1) * keep) for s in ctx.slots])
    steps = len(ctx.sigmas) - 1
    idx = trained_timestep_indices(ctx.batch_slots * keep, steps, cfg.timestep_fraction,
                                   ctx.generator(Stream.TIMESTEPS))
    batches, count, sigma_max = MicroBatches(ctx.state, ctx.shard), idx.numel(), float(ctx.sigmas[1])
    idx = idx[rows]
    for j in range(idx.shape[1]):
        k = idx[:, j]
        x, x_next = states[k, torch.arange(len(k))], states[k + 1, torch.arange(len(k))]
        sigma, sigma_next = ctx.sigmas[k].view(-1, 1, 1, 1), ctx.sigmas[k + 1].view(-1, 1, 1, 1)
        for s in range(0, len(x), cfg.micro_batch):
            mb = slice(s, s + cfg.micro_batch)
            xs, sig, sig_next = x[mb].to(dev), sigma[mb].to(dev), sigma_next[mb].to(dev)
            t_mb = ctx.sigmas[k[mb]].to(dev)
            transition = functools.partial(flow_sde_transition, xs, sigma=sig, sigma_next=sig_next,
                                           noise_level=ctx.sde_noise_level, sigma_max=sigma_max)

            mean_ref = None
            if grpo.kl_weight > 0:
                with ctx.state.use("reference") as model:
                    mean_ref, _ = transition(ctx.velocity(model, xs, t_mb, prompts[mb]))
            with ctx.state.use("theta") as model:
                mean_theta, scale = transition(ctx.velocity(model, xs, t_mb, prompts[mb]))
                log_prob = gaussian_log_prob(x_next[mb].to(dev), mean_theta, scale)
                std = (scale / torch.sqrt(sig - sig_next)).view(-1)
                loss, _ = flow_grpo_loss(log_prob, log_prob.detach(), advantages[mb].to(dev), mean_theta,
                                            mean_theta.detach() if mean_ref is None else mean_ref, std,
                                            clip_range=grpo.clip_range, adv_clip_max=grpo.adv_clip_max,
                                            kl_weight=grpo.kl_weight)
                batches.backward(loss, xs.shape[0] / count)
    grad_norm = batches.step()
    return {"loss": batches.total, "grad_norm": grad_norm, "dropped_micro_batches": batches.dropped}


@dataclass(frozen=True)
class ObjectiveSpec:
    advantages: Callable[[torch.Tensor, LearnerConfig], torch.Tensor]  # rewards [P, K] → what update weighs
    update: Callable[[UpdateContext, list[Group], torch.Tensor], dict[str, float]]
    needs_states: bool  # whether the update trains on the rollout's visited states (not only x0)
    rollout_solver: Solver | None = None  # the solver its training samples must come from; None: the sampler's


OBJECTIVES: dict[str, ObjectiveSpec] = {
    "nft": ObjectiveSpec(nft_advantages, nft_update, needs_states=False),
    "art": ObjectiveSpec(art_advantages, art_update, needs_states=True),
    "flow_grpo": ObjectiveSpec(nft_advantages, grpo_update, needs_states=True, rollout_solver="flow_sde"),
}
