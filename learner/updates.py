"""The update phase of each objective: advantages from rewards, then the optimizer step(s).

    objective  advantages                                   update
    nft        per-prompt centred, globally scaled (mode)   one step of the NFT loss on re-noised x0
    art        raw rewards (or pairwise winner/loser)       two steps, one per window, on visited states
    flow_grpo  per-prompt centred, globally scaled (mode)   `grpo.optimizer_steps` steps of PPO-clip on the SDE
                                                            rollout's steps, against its stored log π_old

Each is an `ObjectiveSpec` in `OBJECTIVES`; the trainer calls `spec.advantages` then `spec.update`.
A micro-batch whose loss is NaN or ±inf is dropped (no backward), the others still update; an update whose
every micro-batch was dropped is skipped. What the source does (NVlabs/Sana `train_scripts/sol_rl/train_sd3.py`,
`main`'s inner loop): it multiplies a non-finite loss by 0.0 and still calls `backward()` — a product that stays
NaN, so the accumulated gradient is NaN. Under fp16 its GradScaler then skips the step; under bf16 (the papers'
setting) nothing does: `clip_grad_norm_` returns a NaN norm and `optimizer.step()` runs unconditionally, which
writes NaN into AdamW's moments and the LoRA weights. We drop the non-finite micro-batch instead, which is what
the guard means to do, and keep every finite one (the source would lose the whole step, or the run). Random
choices come from the iteration's named seed streams.

In a learner group (`learner.data_parallel`) an update sees its rank's slots only: draws that span the
batch are made for the whole batch and sliced, loss weights are shares of the whole batch, and the
gradients are summed over the ranks before the step. Micro-batches are cut from the whole batch
(`micro_batches`): each rank computes its part of every one and the ranks decide together whether it is
finite, so the samples a NaN drops are the same as in one learner, whatever the rank split.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from diffusion.noise import Stream, stream_generator
from diffusion.policy import FlowPolicy
from diffusion.samplers import Solver, flow_sde_transition, gaussian_log_prob
from learner.advantages import compute_advantages
from learner.art import art_guidance, art_loss, art_target, pairwise_scores, sde_kl, split_windows
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
    cfg_scale: float = 1.0  # the rollout's classifier-free guidance (`sampler.cfg_scale`), for flow_grpo's forward
    batch_advantages: torch.Tensor | None = None  # the whole batch's [P, K] (None: the update's own are all)
    passes: int = 0  # per-sample model passes so far: a forward counts 1, a forward with its backward 3
    _uncond: dict[int, Any] = field(default_factory=dict)

    def generator(self, stream: Stream, index: int = 0) -> torch.Generator:
        return stream_generator(self.run_seed, self.iteration, stream, index)

    def velocity(self, model: nn.Module, x: torch.Tensor, sigma: torch.Tensor, prompts: list[str], *,
                 cfg_scale: float = 1.0, detach_uncond: bool = False, counted: bool = True) -> torch.Tensor:
        """v of `model` at (x, σ) for `prompts`; with cfg_scale ≠ 1 guided against the negative prompt (two
        forwards; `detach_uncond`: the gradient through the conditional branch only). `counted`: whether the
        passes count as training work (a diagnostic's do not)."""
        dev, cond = self.policy.device, self.policy.encode(prompts)
        uncond = None
        if cfg_scale != 1.0:
            if len(prompts) not in self._uncond:
                self._uncond[len(prompts)] = self.policy.unconditional(len(prompts))
            uncond = self._uncond[len(prompts)]
        if counted:  # the cost model of bench.convergence charges training by these (a backward ≈ two forwards)
            self.passes += x.shape[0] * (3 if torch.is_grad_enabled() else 1) * (1 if uncond is None else 2)
        with self.state.autocast():
            return self.policy.velocity(x.to(dev), sigma.to(dev), cond, transformer=model, cfg_scale=cfg_scale,
                                        uncond=uncond, detach_uncond=detach_uncond).float()


def micro_batches(positions: torch.Tensor, whole: int, size: int) -> list[slice]:
    """This rank's part of each micro-batch of the whole batch, as slices of its own rows.

    Micro-batch m holds the whole batch's positions [m·size, (m + 1)·size); `positions` (increasing) are
    where this rank's rows sit in the whole batch. Every rank gets ⌈whole/size⌉ slices, empty where it has
    no row in that micro-batch, so the ranks meet at each one (`MicroBatches.backward`). Alone
    (positions = 0..whole − 1) they are the plain slices [m·size, (m + 1)·size).
    """
    edges = torch.arange(0, math.ceil(whole / size) + 1) * size
    bounds = torch.searchsorted(positions.contiguous(), edges).tolist()
    return [slice(a, b) for a, b in itertools.pairwise(bounds)]


class MicroBatches:
    """Accumulates weighted micro-batch losses into θ's gradients, dropping non-finite micro-batches (of the
    whole batch: a micro-batch is kept only when its part is finite on every rank)."""

    def __init__(self, state: TrainingState, shard: Shard = ALONE) -> None:
        self.state, self.shard, self.total, self.kept, self.dropped = state, shard, 0.0, 0, 0

    def backward(self, loss: torch.Tensor | None, weight: float) -> None:
        """`loss`: this rank's part of one micro-batch of the whole batch, None where it has none there.
        Every rank calls this for every micro-batch, in the same order."""
        finite = self.shard.every(loss is None or bool(torch.isfinite(loss.detach()).all()))
        if not finite:
            self.dropped += 1
            return
        self.kept += 1
        if loss is not None:
            (loss * weight).backward()
            self.total += float(loss.detach()) * weight

    def step(self) -> float:
        """The optimizer step (gradient norm) on the whole batch's gradient, or a skipped one when every
        micro-batch was dropped. The loss becomes the whole batch's."""
        self.total = self.shard.sum({"total": self.total})["total"]
        if self.kept == 0:
            self.state.skip_step()
            return math.nan
        self.shard.sum_gradients(list(self.state.theta_parameters().values()))
        return self.state.step(None)


def batch_rows(ctx: UpdateContext, keep: int) -> torch.Tensor:
    """The whole batch's row of each sample this update sees (slot-major, `keep` rows a slot), increasing."""
    return torch.cat([torch.arange(s * keep, (s + 1) * keep) for s in ctx.slots])


def nft_advantages(rewards: torch.Tensor, learner: LearnerConfig) -> torch.Tensor:
    return compute_advantages(rewards, learner.advantage_mode)


def nft_update(ctx: UpdateContext, groups: list[Group], advantages: torch.Tensor) -> dict[str, float]:
    """One optimizer step of DiffusionNFT over every kept sample at a share of the sampler's timesteps."""
    cfg, nft, dev = ctx.learner, ctx.learner.nft, ctx.policy.device
    advantages = advantages.flatten()
    x0 = torch.cat([g.samples.x0 for g in groups])
    prompts = [g.prompt for g in groups for _ in range(g.samples.x0.shape[0])]
    rows = batch_rows(ctx, groups[0].samples.x0.shape[0])
    whole = (ctx.batch_slots * groups[0].samples.x0.shape[0], *x0.shape[1:])
    sigmas = ctx.sigmas[:-1]  # the sampler's own timesteps
    idx = trained_timestep_indices(whole[0], len(sigmas), cfg.timestep_fraction, ctx.generator(Stream.TIMESTEPS))
    batches, count, parts = MicroBatches(ctx.state, ctx.shard), idx.numel(), micro_batches(rows, whole[0],
                                                                                              cfg.micro_batch)
    idx, noise_g = idx[rows], ctx.generator(Stream.TRAIN_NOISE)
    for j in range(idx.shape[1]):
        t = sigmas[idx[:, j]]
        eps = torch.randn(whole, generator=noise_g)[rows]
        x_t = (1 - t.view(-1, 1, 1, 1)) * x0 + t.view(-1, 1, 1, 1) * eps
        for mb in parts:
            if mb.start == mb.stop:
                batches.backward(None, 0.0)
                continue
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
    trained timesteps, their σ and step, the prompt's guidance G(c) from its full group, how many entries
    the window has in the whole batch and where this rank's sit in it (the splits and timesteps of every slot
    are drawn on every rank, in slot order, so each slot's draws do not depend on the ranks)."""
    mine = {slot: i for i, slot in enumerate(ctx.slots)}
    guidance = [art_guidance(g.samples.x0, scores[i]) for i, g in enumerate(groups)]
    sigmas, idx_g, keep = ctx.sigmas, ctx.generator(Stream.TIMESTEPS), groups[0].samples.x0.shape[0]
    splits = [split_windows(keep, ctx.generator(Stream.WINDOWS, slot)) for slot in range(ctx.batch_slots)]
    windows = []
    for w in range(2):
        xs, ts, dts, gs, prompts, positions, count = [], [], [], [], [], [], 0
        for slot in range(ctx.batch_slots):
            members = splits[slot][w]
            idx = trained_timestep_indices(len(members), len(sigmas) - 1, ctx.learner.timestep_fraction, idx_g)
            if slot in mine:
                i = mine[slot]
                g = groups[i]
                positions.extend(range(count, count + idx.numel()))  # the order below: members, then steps
                for row, k in enumerate(members.tolist()):
                    for step in idx[row].tolist():  # states the reverse ODE rollout visited
                        xs.append(g.samples.states[step][k])
                        ts.append(sigmas[step])
                        dts.append(sigmas[step + 1] - sigmas[step])
                        gs.append(guidance[i])
                        prompts.append(g.prompt)
            count += idx.numel()
        windows.append({"x_t": torch.stack(xs), "t": torch.stack(ts), "dt": torch.stack(dts),
                        "guide": torch.stack(gs), "prompts": prompts, "count": count,
                        "positions": torch.tensor(positions)})
    return windows


def art_update(ctx: UpdateContext, groups: list[Group], scores: torch.Tensor) -> dict[str, float]:
    """DiffusionART (docs/objectives.md): a frozen target v* = v_old − G(c) on visited states, two disjoint
    windows per prompt, one step each; the second replays the frozen target after the first moved θ.

    Besides the loss it measures, over the whole batch (every rank): each window's masked fraction; window
    2's restoration, mean (v_θ − v_old)² as window 1 left θ, beside the guidance's mean (v* − v_old)²; and
    the drift the iteration's update caused, the mean SDE KL of θ against θ_old over every visited state
    after both steps (one more forward of θ per state, not counted as training work)."""
    cfg, art, dev = ctx.learner, ctx.learner.art, ctx.policy.device
    windows = _art_windows(ctx, groups, scores)
    # The target is frozen before any update, from the sampling policy θ_old, which is θ at the iteration's
    # start (ART runs with decay 0), and the anchor of the trust mask and restoration. θ_old does not move
    # during the update, so its velocities are kept for both windows' steps and the drift measured after.
    for win in windows:
        win["parts"] = micro_batches(win["positions"], win["count"], cfg.micro_batch)
        with ctx.state.use("old") as model, torch.no_grad():
            v_old = [ctx.velocity(model, win["x_t"][mb], win["t"][mb], win["prompts"][mb])
                     for mb in win["parts"] if mb.start < mb.stop]
        win["v_old"] = torch.cat(v_old) if v_old else torch.empty(0)
        win["target"] = art_target(win["v_old"], win["guide"].to(dev), art.guidance_scale) if v_old else win["v_old"]
    metrics: dict[str, float] = {"dropped_micro_batches": 0}
    for w, (win, restore) in enumerate(zip(windows, (0.0, art.restore_weight), strict=True)):
        count, batches = win["count"], MicroBatches(ctx.state, ctx.shard)
        sums = {"masked": 0.0, "restore": 0.0, "guidance": 0.0}
        for mb in win["parts"]:
            if mb.start == mb.stop:
                batches.backward(None, 0.0)
                continue
            t_mb = win["t"][mb].to(dev)
            with ctx.state.use("theta") as model:
                v_theta = ctx.velocity(model, win["x_t"][mb], t_mb, win["prompts"][mb])
                loss, diag = art_loss(v_theta, win["target"][mb], win["v_old"][mb], t_mb, win["dt"][mb].to(dev),
                                      restore_weight=restore, threshold=art.trust_threshold,
                                      noise_level=art.noise_level, reading=art.trust_mask)
                batches.backward(loss, t_mb.shape[0] / count)
            sums["masked"] += float(diag["masked"])
            sums["restore"] += float(diag["restore_loss"]) * t_mb.shape[0]
            sums["guidance"] += float(diag["guidance_size"]) * t_mb.shape[0]
        metrics[f"window{w + 1}_grad_norm"] = batches.step()  # first: the step makes the loss the batch's
        metrics[f"window{w + 1}_loss"] = batches.total
        metrics["dropped_micro_batches"] += batches.dropped
        sums = ctx.shard.sum(sums)
        metrics[f"window{w + 1}_masked_fraction"] = sums["masked"] / count
        metrics[f"window{w + 1}_restore"] = sums["restore"] / count
        metrics[f"window{w + 1}_guidance"] = sums["guidance"] / count
    metrics["loss"] = metrics["window1_loss"] + metrics["window2_loss"]
    metrics["window2_restore_to_guidance"] = metrics["window2_restore"] / metrics["window2_guidance"] \
        if metrics["window2_guidance"] > 0 else math.nan
    metrics["drift_kl"] = _drift_kl(ctx, windows)
    return metrics


@torch.no_grad()
def _drift_kl(ctx: UpdateContext, windows: list[dict[str, Any]]) -> float:
    """Mean SDE KL (`learner.art.sde_kl`) of θ, as the update left it, against θ_old over every visited state
    of the whole batch."""
    total, states = 0.0, 0
    with ctx.state.use("theta") as model:
        for win in windows:
            for mb in win["parts"]:
                if mb.start < mb.stop:
                    v_theta = ctx.velocity(model, win["x_t"][mb], win["t"][mb], win["prompts"][mb], counted=False)
                    kl = sde_kl(v_theta, win["v_old"][mb], win["t"][mb].to(v_theta.device),
                                win["dt"][mb].to(v_theta.device), ctx.learner.art.noise_level)
                    total += float(kl.sum())
            states += win["count"]
    return ctx.shard.sum({"kl": total})["kl"] / states


def trained_steps(ctx: UpdateContext, rows: int, steps: int) -> torch.Tensor:
    """[rows, ⌊timestep_fraction·steps⌋] rollout steps each sample trains: the first ones in order (the source's
    `train_timesteps = range(num_train_timesteps)`), or a shuffled share per sample."""
    if ctx.learner.grpo.timesteps == "shuffled":
        return trained_timestep_indices(rows, steps, ctx.learner.timestep_fraction, ctx.generator(Stream.TIMESTEPS))
    count = int(ctx.learner.timestep_fraction * steps)
    if not 1 <= count <= steps:
        raise ValueError(f"timestep fraction {ctx.learner.timestep_fraction} of {steps} steps trains {count}: "
                         f"need 1..{steps}")
    return torch.arange(count).expand(rows, count)


def optimizer_batches(ctx: UpdateContext, advantages: torch.Tensor) -> list[torch.Tensor]:
    """The whole batch's rows of each of Flow-GRPO's optimizer steps: the samples with a non-zero advantage
    (all, without `drop_zero_advantage`), shuffled and cut into `optimizer_steps` near-equal shares.

    yifan123/flow_grpo `scripts/train_sd3.py`: it masks out the samples whose advantage is 0 at every
    timestep, shuffles along the batch, rebatches, and accumulates gradients over half the batches per
    optimizer step. (It also turns some dropped samples back on so the count divides its batch number; the
    shares here may differ by one sample instead.)"""
    grpo = ctx.learner.grpo
    rows = torch.arange(advantages.numel())
    if grpo.drop_zero_advantage:
        rows = rows[advantages.flatten() != 0]
    rows = rows[torch.randperm(len(rows), generator=ctx.generator(Stream.OPTIMIZER_BATCHES))]
    return [share for share in torch.tensor_split(rows, grpo.optimizer_steps) if len(share)]


def grpo_update(ctx: UpdateContext, groups: list[Group], advantages: torch.Tensor) -> dict[str, float]:
    """Flow-GRPO (`learner.flow_grpo`) as its source runs it: `grpo.optimizer_steps` optimizer steps per
    rollout, each over its share of the samples (`optimizer_batches`) at their trained steps (`trained_steps`).
    The ratio's denominator is log π_old as the rollout stored it while sampling (`Generated.log_probs`), so
    from the second step on θ ≠ θ_old, ratios move off 1 and the clip binds. The training forward applies the
    rollout's CFG (`sampler.cfg_scale`), as the source's `compute_log_prob` with `train.cfg`, so the
    log-probability is the sampling policy's; the reference's mean for the KL too. As there, the unconditional
    branch is detached (`grpo.cfg_gradient = "conditional"`): the gradient is s·∇v_c. Logged per optimizer
    step and over all: ratio_mean, clip_fraction, approx_kl (the whole batch's)."""
    cfg, grpo, dev = ctx.learner, ctx.learner.grpo, ctx.policy.device
    keep = groups[0].samples.x0.shape[0]
    whole_adv = (ctx.batch_advantages if ctx.batch_advantages is not None else advantages).flatten()
    local_adv = advantages.flatten()
    states = torch.stack([torch.cat([g.samples.states[k] for g in groups]) for k in range(len(ctx.sigmas))])
    old_log_probs = torch.cat([g.samples.log_probs for g in groups])  # [rows, steps]
    prompts = [g.prompt for g in groups for _ in range(keep)]
    local_of = {int(r): i for i, r in enumerate(batch_rows(ctx, keep))}  # whole-batch row → this rank's row
    steps = trained_steps(ctx, len(whole_adv), len(ctx.sigmas) - 1)
    sigma_max, metrics = float(ctx.sigmas[1]), {"dropped_micro_batches": 0}
    totals = dict.fromkeys(("samples", "ratio", "clipped", "approx_kl"), 0.0)
    shares = optimizer_batches(ctx, whole_adv)
    for n, share in enumerate(shares):
        mine = [(p, local_of[int(r)]) for p, r in enumerate(share) if int(r) in local_of]  # by position in share
        positions = torch.tensor([p for p, _ in mine], dtype=torch.long)
        local, whole_rows = torch.tensor([i for _, i in mine], dtype=torch.long), share[positions]
        parts = micro_batches(positions, len(share), cfg.micro_batch)
        batches, count = MicroBatches(ctx.state, ctx.shard), len(share) * steps.shape[1]
        sums = dict.fromkeys(totals, 0.0)
        for j in range(steps.shape[1]):
            for mb in parts:
                if mb.start == mb.stop:
                    batches.backward(None, 0.0)
                    continue
                rows = local[mb]
                k = steps[whole_rows[mb], j]  # each sample's rollout step
                x, x_next = states[k, rows].to(dev), states[k + 1, rows].to(dev)
                sig, sig_next = ctx.sigmas[k].view(-1, 1, 1, 1).to(dev), ctx.sigmas[k + 1].view(-1, 1, 1, 1).to(dev)
                t_mb, mb_prompts = ctx.sigmas[k].to(dev), [prompts[i] for i in rows.tolist()]
                transition = functools.partial(flow_sde_transition, x, sigma=sig, sigma_next=sig_next,
                                               noise_level=ctx.sde_noise_level, sigma_max=sigma_max)
                mean_ref = None
                if grpo.kl_weight:
                    with ctx.state.use("reference") as model:
                        mean_ref, _ = transition(ctx.velocity(model, x, t_mb, mb_prompts, cfg_scale=ctx.cfg_scale))
                with ctx.state.use("theta") as model:
                    mean_theta, scale = transition(ctx.velocity(model, x, t_mb, mb_prompts, cfg_scale=ctx.cfg_scale,
                                                                detach_uncond=grpo.cfg_gradient == "conditional"))
                    log_prob = gaussian_log_prob(x_next, mean_theta, scale)
                    std = (scale / torch.sqrt(sig - sig_next)).view(-1)
                    loss, diag = flow_grpo_loss(log_prob, old_log_probs[rows, k].to(dev), local_adv[rows].to(dev),
                                                mean_theta, mean_theta.detach() if mean_ref is None else mean_ref,
                                                std, clip_range=grpo.clip_range, adv_clip_max=grpo.adv_clip_max,
                                                kl_weight=grpo.kl_weight or 0.0)
                    batches.backward(loss, len(rows) / count)
                sums["samples"] += len(rows)
                sums["ratio"] += float(diag["ratio_mean"]) * len(rows)
                sums["clipped"] += float(diag["clip_fraction"]) * len(rows)
                sums["approx_kl"] += float(diag["approx_kl"]) * len(rows)
        metrics[f"step{n + 1}_grad_norm"] = batches.step()
        metrics[f"step{n + 1}_loss"] = batches.total
        metrics["dropped_micro_batches"] += batches.dropped
        sums = ctx.shard.sum(sums)
        metrics[f"step{n + 1}_ratio_mean"] = sums["ratio"] / sums["samples"]
        metrics[f"step{n + 1}_clip_fraction"] = sums["clipped"] / sums["samples"]
        metrics[f"step{n + 1}_approx_kl"] = sums["approx_kl"] / sums["samples"]
        totals = {key: totals[key] + sums[key] for key in totals}
    trained = totals["samples"] or math.nan
    metrics.update(loss=sum(metrics.get(f"step{n + 1}_loss", 0.0) for n in range(len(shares))),
                   grad_norm=metrics.get(f"step{len(shares)}_grad_norm", math.nan),
                   ratio_mean=totals["ratio"] / trained, clip_fraction=totals["clipped"] / trained,
                   approx_kl=totals["approx_kl"] / trained, trained_samples=sum(len(s) for s in shares))
    return metrics


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
