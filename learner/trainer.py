"""The single-process Sol-RL trainer: explore → select → regenerate → reward → update → publish.

One iteration, for P prompt slots (prompts and seeds are pure functions of run seed, iteration, slot):

    family         explored (proxy)                  trained on
    diffusionnft   —                                 K full-precision samples, train steps (K-in-K)
    naive_scaling  N full precision, train steps     the K selected samples themselves
    naive_quant    N low precision, train steps      the K selected low-precision samples
    sol_rl         N low precision, explore steps    the K selected seeds regenerated in full precision

then advantages (per-prompt centring, global scale), one optimizer step of the objective (NFT, or
ART's two windows), the soft update of the sampling policy, and the publication of its merged
weights to the low-precision engine. The Ray learner actor wraps this class; explorers call
`learner.rollouts.explore_group`, the same function `collect` uses here.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.stats import spearmanr

from diffusion.explore import build_explore_engine
from diffusion.loading import load_policy_from_config
from diffusion.noise import derive_seed, derive_seeds, initial_noise
from diffusion.prompts import load_prompts
from diffusion.quant import eligible_linear_names, load_weights
from diffusion.samplers import sample_ode
from learner.advantages import compute_advantages
from learner.art import art_guidance, art_loss, art_target, pairwise_scores, split_windows
from learner.checkpoint import check_finite, load_checkpoint, save_checkpoint, write_safetensors
from learner.config import TrainerConfig
from learner.objectives import nft_loss, trained_timestep_indices
from learner.rollouts import Generated, RankedGroup, explore_group, generate
from learner.selection import select_candidates
from learner.training_state import TrainingState
from rewards import build_reward_from_config

# Stream ids for derive_seed(run_seed, iteration, STREAM, index): one per kind of random choice.
PROMPT_STREAM, SELECT_STREAM, TIMESTEP_STREAM, NOISE_STREAM, SHUFFLE_STREAM, WINDOW_STREAM = -1, -2, -3, -4, -5, -6
EVAL_ITERATION = -1
BASE_EVAL_FILE = "base_eval.json"


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def prompts_for(prompts: list[str], run_seed: int, iteration: int, count: int) -> list[str]:
    """The iteration's prompt slots: a permutation seeded by (run seed, iteration), cycled to `count`."""
    order = torch.randperm(len(prompts), generator=_generator(derive_seed(run_seed, iteration, PROMPT_STREAM, 0)))
    return [prompts[order[i % len(prompts)]] for i in range(count)]


@dataclass
class Group:
    """What one prompt slot contributes to the update."""

    prompt: str
    samples: Generated  # the K training samples (x0, true rewards, visited states)
    proxy: torch.Tensor | None  # proxy rewards of those K seeds, when a cheaper pass ranked them


class Trainer:
    def __init__(
        self,
        config: TrainerConfig,
        run_dir: str | Path | None = None,
        *,
        publish: Callable[[dict[str, torch.Tensor], int], Any] | None = None,
    ) -> None:
        """`publish(weights, version)` replaces loading the local engine (the Ray learner sends the
        sampling policy to the weight-sync service instead; explorers then rank remotely)."""
        self.config = config
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.seed = config.run.seed
        self.policy = load_policy_from_config(config.model)
        self.reward = build_reward_from_config(config.reward)
        self._publish = publish
        family = config.learner.family
        quant = self.policy.family.quant
        explore = config.explore
        # What the explore engine quantizes (the nvfp4 weight-sync codec packs exactly these weights).
        self.quantized_weights = [] if explore.precision == "none" else [
            f"{name}.weight" for name in eligible_linear_names(
                self.policy.transformer, skip=quant.skip if explore.skip is None else explore.skip,
                min_dim=quant.min_dim if explore.min_dim is None else explore.min_dim)
        ]
        # The engine copies the plain transformer before LoRA is injected into it. A learner whose
        # explorers are remote needs none, except naive_quant, which trains on low-precision samples.
        needs_engine = family == "naive_quant" or (family == "sol_rl" and publish is None)
        self.engine = build_explore_engine(self.policy, config.explore) if needs_engine else None
        self.state = TrainingState.from_policy(self.policy, config.training, seed=derive_seed(self.seed, 0, -100, 0))
        self.prompts = load_prompts(config.prompts.source)
        self.eval_prompts = load_prompts(config.prompts.eval_source, heldout=True)[: config.eval.prompts]
        self.iteration = 0
        self.version = 0  # policy version: successful updates so far
        self.counters = {"fp_sample_steps": 0, "lp_sample_steps": 0, "skipped_updates": 0}
        self.history: list[dict[str, Any]] = []
        self.base_eval: dict[str, float] = {}
        self.publish()

    # ---- the sampling policy -------------------------------------------------------------------
    def publish(self) -> float:
        """Copy the sampling policy's merged weights into the low-precision engine (or hand them to the
        `publish` callback); seconds spent. Raises `learner.checkpoint.NonFiniteWeights`, publishing
        nothing, when a weight is NaN or ±inf: explorers must never rank with a broken policy."""
        start = time.perf_counter()
        if self._publish is None and self.engine is None:
            return time.perf_counter() - start
        weights = self.state.sampling_weights()
        check_finite(weights, f"publish: refusing to publish a non-finite sampling policy (version {self.version})")
        if self._publish is not None:
            self._publish(weights, self.version)
        if self.engine is not None:
            load_weights(self.engine, weights)
        return time.perf_counter() - start

    def prompts_for(self, iteration: int) -> list[str]:
        return prompts_for(self.prompts, self.seed, iteration, self.config.prompts.per_iteration)

    # ---- rollouts ------------------------------------------------------------------------------
    def _full(self, prompt: str, seeds: list[int], return_states: bool = False) -> Generated:
        cfg = self.config.sampler
        self.counters["fp_sample_steps"] += len(seeds) * cfg.steps
        with self.state.use("old") as model:
            return generate(self.policy, model, self.reward, prompt, seeds, steps=cfg.steps, solver=cfg.solver,
                            return_states=return_states)

    def _low(self, prompt: str, seeds: list[int], steps: int, return_states: bool = False) -> Generated:
        self.counters["lp_sample_steps"] += len(seeds) * steps
        return generate(self.policy, self.engine, self.reward, prompt, seeds, steps=steps,
                        solver=self.config.explore.solver, return_states=return_states)

    def explore(self, iteration: int, slot: int, prompt: str) -> RankedGroup:
        """The explorer's job for one slot (sol_rl): N seeds in low precision at explore steps."""
        seeds = derive_seeds(self.seed, iteration, slot, self.config.prompts.candidates)
        self.counters["lp_sample_steps"] += len(seeds) * self.config.explore.steps
        return explore_group(self.policy, self.engine, self.reward, iteration=iteration, slot=slot, prompt=prompt,
                             seeds=seeds, steps=self.config.explore.steps, solver=self.config.explore.solver,
                             policy_version=self.version)

    def select(self, group: RankedGroup) -> list[int]:
        g = _generator(derive_seed(self.seed, group.iteration, SELECT_STREAM, group.slot))
        chosen = select_candidates(group.proxy, self.config.prompts.keep, self.config.learner.selection, g)
        return chosen.tolist()

    def collect(self, iteration: int, slot: int, prompt: str, group: RankedGroup | None = None) -> Group:
        """The K training samples of one slot, by the paper's family. `group` may come from an explorer."""
        family, k, n = self.config.learner.family, self.config.prompts.keep, self.config.prompts.candidates
        states = self.config.learner.objective == "art"
        if family == "diffusionnft":
            return Group(prompt, self._full(prompt, derive_seeds(self.seed, iteration, slot, k), states), None)
        if family == "sol_rl":
            group = group or self.explore(iteration, slot, prompt)
            chosen = self.select(group)
            regenerated = self._full(prompt, [group.seeds[i] for i in chosen], states)
            return Group(prompt, regenerated, group.proxy[chosen])
        seeds = derive_seeds(self.seed, iteration, slot, n)
        pool = (self._full(prompt, seeds, states) if family == "naive_scaling"
                else self._low(prompt, seeds, self.config.sampler.steps, states))
        ranked = RankedGroup(iteration, slot, prompt, seeds, pool.rewards, self.version)
        chosen = self.select(ranked)
        kept = Generated([seeds[i] for i in chosen], pool.x0[chosen], pool.rewards[chosen],
                         [s[chosen] for s in pool.states] if pool.states is not None else None)
        return Group(prompt, kept, None)

    # ---- the update ----------------------------------------------------------------------------
    def _rewards_for_update(self, iteration: int, groups: list[Group]) -> torch.Tensor:
        rewards = torch.stack([g.samples.rewards for g in groups])  # [P, K]
        if self.config.learner.shuffle_rewards:  # control: break the reward ↔ sample link within each prompt
            g = _generator(derive_seed(self.seed, iteration, SHUFFLE_STREAM, 0))
            rewards = torch.stack([row[torch.randperm(row.numel(), generator=g)] for row in rewards])
        return rewards

    def _velocity(self, model, x: torch.Tensor, sigma: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        with self.state.autocast():
            return self.policy.velocity(x, sigma, self.policy.encode(prompts), transformer=model).float()

    def update_nft(self, iteration: int, groups: list[Group], rewards: torch.Tensor) -> dict[str, float]:
        cfg, nft = self.config.learner, self.config.learner.nft
        advantages = compute_advantages(rewards, cfg.advantage_mode).flatten()
        x0 = torch.cat([g.samples.x0 for g in groups])
        prompts = [g.prompt for g in groups for _ in range(g.samples.x0.shape[0])]
        sigmas = self.policy.sigmas(self.config.sampler.steps)[:-1]  # the sampler's own timesteps
        idx = trained_timestep_indices(len(x0), len(sigmas), cfg.timestep_fraction,
                                       _generator(derive_seed(self.seed, iteration, TIMESTEP_STREAM, 0)))
        noise_g = _generator(derive_seed(self.seed, iteration, NOISE_STREAM, 0))
        total, count = 0.0, idx.numel()
        for j in range(idx.shape[1]):
            t = sigmas[idx[:, j]]
            eps = torch.randn(x0.shape, generator=noise_g)
            x_t = (1 - t.view(-1, 1, 1, 1)) * x0 + t.view(-1, 1, 1, 1) * eps
            for s in range(0, len(x0), cfg.micro_batch):
                mb = slice(s, s + cfg.micro_batch)
                dev = self.policy.device
                xt_mb, t_mb = x_t[mb].to(dev), t[mb].to(dev)
                with self.state.use("old") as model:
                    v_old = self._velocity(model, xt_mb, t_mb, prompts[mb])
                with self.state.use("reference") as model:
                    v_ref = self._velocity(model, xt_mb, t_mb, prompts[mb])
                with self.state.use("theta") as model:
                    v_theta = self._velocity(model, xt_mb, t_mb, prompts[mb])
                    loss = nft_loss(v_theta, v_old, v_ref, xt_mb, x0[mb].to(dev), t_mb, advantages[mb].to(dev),
                                    beta=nft.beta, adv_clip_max=nft.adv_clip_max, kl_weight=nft.kl_weight)
                    (loss * (t_mb.shape[0] / count)).backward()
                total += float(loss.detach()) * t_mb.shape[0] / count
        grad_norm = self.state.step(None)
        return {"loss": total, "grad_norm": grad_norm}

    def update_art(self, iteration: int, groups: list[Group], rewards: torch.Tensor) -> dict[str, float]:
        """DiffusionART (docs/objectives.md): a frozen target v* = v_start − η·G(c) on visited states,
        two disjoint windows per prompt, restoration toward the sampling policy in the second."""
        cfg, art = self.config.learner, self.config.learner.art
        sigmas, dev = self.policy.sigmas(self.config.sampler.steps), self.policy.device
        # Guidance per prompt from the full K group; pairwise replaces rewards by winner/loser scores.
        scores = pairwise_scores(rewards) if art.pairwise else rewards
        guidance = [art_guidance(g.samples.x0, scores[i]) for i, g in enumerate(groups)]
        idx_g = _generator(derive_seed(self.seed, iteration, TIMESTEP_STREAM, 0))
        windows: list[dict[str, Any]] = []
        for w in range(2):
            xs, ts, dts, gs, prompts = [], [], [], [], []
            for i, g in enumerate(groups):
                split = split_windows(g.samples.x0.shape[0], _generator(derive_seed(self.seed, iteration,
                                                                                     WINDOW_STREAM, i)))
                members = split[w]
                idx = trained_timestep_indices(len(members), len(sigmas) - 1, cfg.timestep_fraction, idx_g)
                for row, k in enumerate(members.tolist()):
                    for step in idx[row].tolist():  # states the reverse ODE rollout visited
                        xs.append(g.samples.states[step][k])
                        ts.append(sigmas[step])
                        dts.append(sigmas[step + 1] - sigmas[step])
                        gs.append(guidance[i])
                        prompts.append(g.prompt)
            windows.append({"x_t": torch.stack(xs), "t": torch.stack(ts), "dt": torch.stack(dts),
                            "guide": torch.stack(gs), "prompts": prompts})
        # The target is frozen before any update: v_start is θ at the iteration's start, for both windows.
        for win in windows:
            with self.state.use("theta") as model, torch.no_grad():
                v_start = torch.cat([
                    self._velocity(model, win["x_t"][s:s + cfg.micro_batch].to(dev), win["t"][s:s + cfg.micro_batch]
                                   .to(dev), win["prompts"][s:s + cfg.micro_batch])
                    for s in range(0, len(win["prompts"]), cfg.micro_batch)])
            win["target"] = art_target(v_start, win["guide"].to(dev), art.guidance_scale)
        metrics: dict[str, float] = {}
        for w, (win, restore) in enumerate(zip(windows, (0.0, art.restore_weight), strict=True)):
            count, total = len(win["prompts"]), 0.0
            for s in range(0, count, cfg.micro_batch):
                mb = slice(s, s + cfg.micro_batch)
                xt_mb, t_mb = win["x_t"][mb].to(dev), win["t"][mb].to(dev)
                with self.state.use("old") as model:  # the sampling policy: the restoration's anchor
                    v_old = self._velocity(model, xt_mb, t_mb, win["prompts"][mb])
                with self.state.use("theta") as model:
                    v_theta = self._velocity(model, xt_mb, t_mb, win["prompts"][mb])
                    loss, diag = art_loss(v_theta, win["target"][mb], v_old, t_mb, win["dt"][mb].to(dev),
                                          restore_weight=restore, threshold=art.trust_threshold,
                                          noise_level=art.noise_level)
                    (loss * (t_mb.shape[0] / count)).backward()
                total += float(loss.detach()) * t_mb.shape[0] / count
                metrics[f"window{w + 1}_masked_fraction"] = float(diag["masked_fraction"])
            metrics[f"window{w + 1}_loss"] = total
            metrics[f"window{w + 1}_grad_norm"] = self.state.step(None)
        metrics["loss"] = metrics["window1_loss"] + metrics["window2_loss"]
        return metrics

    # ---- one iteration -------------------------------------------------------------------------
    def train_iteration(self, iteration: int, groups: list[RankedGroup] | None = None) -> dict[str, Any]:
        """One iteration; `groups` are ranked groups from explorers (sol_rl), else explored here."""
        start = time.perf_counter()
        before = dict(self.counters)
        prompts = self.prompts_for(iteration)
        by_slot = {g.slot: g for g in groups or []}
        collected = [self.collect(iteration, slot, p, by_slot.get(slot)) for slot, p in enumerate(prompts)]
        rollout_s = time.perf_counter() - start

        rewards = self._rewards_for_update(iteration, collected)
        # The kept seeds were regenerated by the current sampling policy (version self.version), however
        # old the policy that ranked them: asynchrony only makes the *choice* of seeds stale.
        metrics: dict[str, Any] = {"iteration": iteration, "policy_version": self.version,
                                   "sampled_with_version": self.version,
                                   "reward_mean": float(rewards.mean()), "reward_max": float(rewards.max())}
        if "accuracy" in collected[0].samples.details:
            metrics["accuracy"] = float(torch.cat([g.samples.details["accuracy"] for g in collected]).mean())
        metrics.update(self._rank_fidelity(collected))
        t0 = time.perf_counter()
        if not bool(torch.isfinite(rewards).all()):
            self.counters["skipped_updates"] += 1  # nothing is trained, nothing is published
            metrics["skipped"] = True
        else:
            update = self.update_art if self.config.learner.objective == "art" else self.update_nft
            skipped_before = self.state.skipped_steps
            metrics.update(update(iteration, collected, rewards))
            if self.state.skipped_steps > skipped_before:
                self.counters["skipped_updates"] += 1
                metrics["skipped"] = True
            else:
                self.state.soft_update(self.config.learner.decay.decay(self.version))
                self.version += 1
        train_s = time.perf_counter() - t0
        sync_s = self.publish() if not metrics.get("skipped") else 0.0
        metrics.update({"rollout_s": rollout_s, "train_s": train_s, "sync_s": sync_s,
                        "iteration_s": time.perf_counter() - start,
                        **{k: self.counters[k] - before[k] for k in ("fp_sample_steps", "lp_sample_steps")},
                        "skipped_updates": self.counters["skipped_updates"]})
        return metrics

    def _rank_fidelity(self, groups: list[Group]) -> dict[str, float]:
        """Spearman ρ of proxy vs true rewards on the kept seeds, and how often the proxy put a seed
        on the right side of the true median (the selection precision)."""
        pairs = [(g.proxy.numpy(), g.samples.rewards.numpy()) for g in groups if g.proxy is not None]
        if not pairs:
            return {}
        rho = [float(spearmanr(p, r).statistic) for p, r in pairs]
        rho = [x for x in rho if not math.isnan(x)] or [math.nan]  # constant rewards have no ρ
        precision = [np.mean((p > np.median(p)) == (r > np.median(r))) for p, r in pairs]
        return {"rank_spearman": float(np.mean(rho)), "selection_precision": float(np.mean(precision))}

    # ---- evaluation ----------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Held-out prompts × fixed seeds, full precision, the sampler's steps, with the trained policy θ."""
        cfg = self.config.eval
        rewards, accuracy = [], []
        for slot, prompt in enumerate(self.eval_prompts):
            seeds = derive_seeds(self.seed, EVAL_ITERATION, slot, cfg.seeds_per_prompt)
            with self.state.use("theta") as model:
                out = generate(self.policy, model, self.reward, prompt, seeds, steps=self.config.sampler.steps,
                               solver=self.config.sampler.solver)
            rewards.append(out.rewards)
            if "accuracy" in out.details:
                accuracy.append(out.details["accuracy"])
        result = {"eval_reward": float(torch.cat(rewards).mean())}
        if accuracy:
            result["eval_accuracy"] = float(torch.cat(accuracy).mean())
        return result

    @staticmethod
    @contextlib.contextmanager
    def _grid_numerics() -> Iterator[None]:
        """The fixed numeric setting of `sample_images`: one CPU thread; on CUDA no TF32, no reduced-
        precision reductions, deterministic cuDNN without autotuning. The previous settings return."""
        cuda, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
        flags = [(cuda, "allow_tf32", False), (cuda, "allow_fp16_reduced_precision_reduction", False),
                 (cuda, "allow_bf16_reduced_precision_reduction", False), (cudnn, "allow_tf32", False),
                 (cudnn, "deterministic", True), (cudnn, "benchmark", False)]
        saved = [(owner, name, getattr(owner, name)) for owner, name, _ in flags]
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            for owner, name, value in flags:
                setattr(owner, name, value)
            yield
        finally:
            torch.set_num_threads(threads)
            for owner, name, value in saved:
                setattr(owner, name, value)

    def _plain_transformer(self, weights: dict[str, torch.Tensor]) -> torch.nn.Module:
        """A transformer of the policy's class and config, without adapters, holding `weights` (shared,
        not copied; made on the meta device first, so nothing is initialised and no RNG is drawn)."""
        template = self.state.transformer
        with torch.device("meta"):
            model = type(template).from_config(template.config)
        model.load_state_dict({k: v.detach().contiguous() for k, v in weights.items()}, strict=True, assign=True)
        own = dict(template.named_buffers())
        for name, buffer in list(model.named_buffers()):
            if buffer.is_meta:  # a non-persistent buffer is in no state dict: take the policy's own
                module, _, attribute = name.rpartition(".")
                model.get_submodule(module).register_buffer(attribute, own[name], persistent=False)
        return model.eval().requires_grad_(False)

    @torch.no_grad()
    def sample_images(self, seeds_per_prompt: int = 6) -> torch.Tensor:
        """Held-out prompts × fixed seeds with θ, full precision: images [P·S, C, H, W] (a grid's rows).

        A pure function of θ's merged weights and the config, whatever this process did before (a
        resumed run's grid is the undisturbed run's, byte for byte): θ is merged into a plain
        transformer — the weights final/transformer.safetensors holds — each prompt is encoded on its
        own rather than through the policy's prompt cache (a cached encoding depends on the batch the
        prompt first came in, and CLIP's pooled output differs in the last bit between batch sizes and
        thread counts), and all of it runs in `_grid_numerics`. The global RNG is not drawn from.
        """
        seeds = [s for slot in range(len(self.eval_prompts))
                 for s in derive_seeds(self.seed, EVAL_ITERATION, 1000 + slot, seeds_per_prompt)]
        cfg, policy = self.config.sampler, self.policy
        model = self._plain_transformer(self.state.merged_weights("theta"))
        with self._grid_numerics():
            encoded = [policy.family.encode(policy.components, [prompt]) for prompt in self.eval_prompts]
            cond = {k: torch.cat([e[k] for e in encoded]).repeat_interleave(seeds_per_prompt, dim=0)
                    for k in encoded[0]}
            noise = initial_noise(seeds, policy.latent_shape, device=policy.device)
            x0 = sample_ode(lambda x, sigma: policy.velocity(x, sigma, cond, transformer=model), noise,
                            policy.sigmas(cfg.steps).to(policy.device), cfg.solver).x0
            return policy.decode(x0)

    # ---- the loop, checkpoints -----------------------------------------------------------------
    def checkpoint(self) -> None:
        if self.run_dir is not None:
            save_checkpoint(self.run_dir / "checkpoint", self.state, iteration=self.iteration,
                            extra={"version": self.version, "counters": self.counters})

    def resume(self, checkpoint: str | Path | None = None) -> None:
        """Continue from run_dir/checkpoint (or the folder given): bitwise the same continuation as not
        stopping (on CPU). The run's history comes back with it: metrics.jsonl is cut to the
        checkpoint's iteration (lines logged after it are redone) and the base evaluation is reloaded."""
        folder = Path(checkpoint) if checkpoint is not None else self.run_dir / "checkpoint"
        info = load_checkpoint(folder, self.state)
        self.iteration, self.version = info["iteration"], info["extra"]["version"]
        self.counters = dict(info["extra"]["counters"])
        self.history = truncate_metrics(self.run_dir / "metrics.jsonl", self.iteration)
        base = self.run_dir / BASE_EVAL_FILE
        self.base_eval = json.loads(base.read_text()) if base.is_file() else {}
        self.publish()

    def evaluate_base(self) -> dict[str, float]:
        """The base model's held-out reward, before any update; kept in run_dir for resumed runs."""
        if self.version != 0:
            raise RuntimeError(f"the base model is version 0; this trainer holds version {self.version}")
        self.base_eval = self.evaluate()
        if self.run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / BASE_EVAL_FILE).write_text(json.dumps(self.base_eval) + "\n")
        return self.base_eval

    def finish_iteration(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """After an update: count it, evaluate when due, log, checkpoint when due."""
        self.iteration += 1
        every, total, ckpt = self.config.eval.every, self.config.run.iterations, self.config.run.checkpoint_every
        if every and (self.iteration % every == 0 or self.iteration == total):
            metrics.update(self.evaluate())
        metrics["policy_version"] = self.version
        self.history.append(metrics)
        if self.run_dir is not None:
            self.log_metrics(metrics)
            if (ckpt and self.iteration % ckpt == 0) or self.iteration == total:
                self.checkpoint()
        return metrics

    def log_metrics(self, metrics: dict[str, Any]) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with (self.run_dir / "metrics.jsonl").open("a") as f:
            f.write(json.dumps(metrics) + "\n")

    def save_final(self, folder: Path) -> dict[str, str]:
        """The trained policy θ (merged into plain transformer keys) and the sampling policy θ_old,
        as safetensors, with the run's config as JSON. The files' metadata ({"iteration",
        "policy_version"}, read with `learner.checkpoint.safetensors_metadata`) is written so that
        equal weights give equal bytes. Raises `learner.checkpoint.NonFiniteWeights`, writing
        nothing, when either view holds NaN or ±inf."""
        views = {"theta": "transformer.safetensors", "old": "sampling_transformer.safetensors"}
        weights = {view: self.state.merged_weights(view) for view in views}
        for view, tensors in weights.items():
            check_finite(tensors, f"save_final: refusing to write non-finite {view} weights to {folder}")
        folder.mkdir(parents=True, exist_ok=True)
        files = {}
        for view, name in views.items():
            write_safetensors(folder / name, weights[view], {"iteration": self.iteration,
                                                             "policy_version": self.version})
            files[view] = str(folder / name)
        (folder / "config.json").write_text(self.config.model_dump_json(indent=2) + "\n")
        return files

    def run(self, iterations: int | None = None, log=print) -> list[dict[str, Any]]:
        total = self.config.run.iterations if iterations is None else iterations
        while self.iteration < total:
            log(progress_line(self.finish_iteration(self.train_iteration(self.iteration))))
        return self.history


def truncate_metrics(path: Path, iteration: int) -> list[dict[str, Any]]:
    """Keep the metrics of iterations before `iteration` (what a checkpoint at `iteration` covers):
    the file is rewritten atomically; returns the kept records. A torn last line (a crash mid-write)
    is dropped."""
    if not path.is_file():
        return []
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("iteration", iteration) < iteration:
            kept.append(record)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
    tmp.replace(path)
    return kept


def progress_line(m: dict[str, Any]) -> str:
    parts = [f"iter {m['iteration']:3d}", f"reward {m['reward_mean']:7.3f}"]
    if "eval_reward" in m:
        parts.append(f"held-out {m['eval_reward']:7.3f}" + (f" acc {m['eval_accuracy']:.3f}" if "eval_accuracy" in m
                                                             else ""))
    if "rank_spearman" in m and not math.isnan(m["rank_spearman"]):
        parts.append(f"ρ {m['rank_spearman']:.2f}")
    timing = f"explore {m['explore_seconds']:.1f}s regen {m['rollout_s']:.1f}s" if "explore_seconds" in m \
        else f"rollout {m['rollout_s']:.1f}s"
    parts.append(f"{timing} train {m['train_s']:.1f}s sync {m['sync_s']:.2f}s")
    if m.get("skipped"):
        parts.append("SKIPPED")
    return "  ".join(parts)
