"""The sampling policy: a loaded model that encodes prompts, predicts velocities, samples and decodes.

One class for every family; the family object supplies the model-specific parts. The transformer
used for a forward can be swapped per call (`transformer=`), which is how the low-precision explore
engine — a quantized copy of the same transformer — reuses the prompt cache, the noise and the
samplers of the full-precision policy.

Two memory options for high resolutions on one GPU, both off by default: `offload_text_encoders`
keeps the text encoders on the CPU between prompt encodings (they only ever encode prompts that are
not cached yet), and `sequential_decode` decodes one latent at a time (the official Sol-RL option of
the same name, NVlabs/Sana `diffusion/post_training/diffusers_patch/pipeline_with_logprob.py`,
`pipeline_with_logprob_sd3` and its FLUX and SANA versions), which bounds the VAE decoder's
activations to one image's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from diffusion.families import Conditioning, Family
from diffusion.noise import initial_noise, sde_noise
from diffusion.samplers import SampleResult, SigmaGrid, Solver, linspace_sigmas, sample_ode


class FlowPolicy:
    def __init__(
        self,
        family: Family,
        components: Mapping[str, nn.Module],
        *,
        scheduler: Mapping[str, Any],
        latent_shape: tuple[int, int, int],
        device: torch.device,
        dtype: torch.dtype,
        shift: float | None = None,
        guidance: float | None = None,
        offload_text_encoders: bool = False,
        sequential_decode: bool = False,
        sigma_grid: SigmaGrid = "scheduler",
    ) -> None:
        """`scheduler`: the folder's scheduler config (the σ grid's shift); `shift` overrides its shift;
        `sigma_grid`: "scheduler" (that grid) or "linspace" (`linspace_sigmas`, unshifted: no `shift`);
        `guidance`: the distilled guidance value of families that take one (None: the family's default);
        `offload_text_encoders`: the text encoders live on the CPU and visit `device` only while encoding;
        `sequential_decode`: `decode` runs the VAE on one latent at a time."""
        self.family = family
        self.components = dict(components)
        self.transformer: nn.Module = self.components["transformer"]
        self.vae: nn.Module | None = self.components.get("vae")
        if sigma_grid == "linspace" and shift is not None:
            raise ValueError(f"sigma_grid 'linspace' is unshifted; got shift {shift}: leave shift unset")
        self.scheduler = dict(scheduler)
        self.shift = shift
        self.sigma_grid = sigma_grid
        self.latent_shape = latent_shape
        self.device = device
        self.dtype = dtype
        self.guidance = family.default_guidance if guidance is None else guidance
        self._prompt_cache: dict[str, Conditioning] = {}
        self.offload_text_encoders = offload_text_encoders
        self.sequential_decode = sequential_decode
        # The family's text encoders (its tokenizers are not modules and never move).
        self.text_encoders: dict[str, nn.Module] = {
            name: self.components[name] for name in family.text_components
            if isinstance(self.components.get(name), nn.Module)
        }
        # Where the text encoders stay between encodings: the CPU when offloading, else the model's device.
        self.text_encoder_home = torch.device("cpu") if offload_text_encoders else device
        if offload_text_encoders:
            for encoder in self.text_encoders.values():
                encoder.to(self.text_encoder_home)

    def use_transformer(self, module: nn.Module) -> None:
        """Make `module` the policy's transformer (an explore engine built in place from the old one): the
        default of `velocity` and `sample`, and what the family reads its config from. The policy keeps no
        other reference to the old one, so nothing holds a second copy."""
        self.transformer = self.components["transformer"] = module

    # ---- prompts -------------------------------------------------------------------------------
    @torch.inference_mode()
    def encode(self, prompts: Sequence[str]) -> Conditioning:
        """Conditioning for a batch of prompts; each distinct prompt is encoded once and cached.

        A prompt is encoded alone, on one CPU thread, so its encoding is a pure function of the prompt
        (a text encoder's output differs in the last bit between batch sizes and thread counts, and
        the sampling grids and resumed runs must not depend on which batch a prompt came first in).
        With `offload_text_encoders` the encoders visit the device only when a prompt is missing.
        """
        missing = [p for p in dict.fromkeys(prompts) if p not in self._prompt_cache]
        if missing:
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                with self._text_encoders_visiting():
                    for prompt in missing:
                        encoded = self.family.encode(self.components, [prompt])
                        self._prompt_cache[prompt] = {k: v.clone() for k, v in encoded.items()}
            finally:
                torch.set_num_threads(threads)
        cond = self.family.collate([self._prompt_cache[p] for p in prompts])
        if self.guidance is not None:
            cond["guidance"] = torch.full((len(prompts),), float(self.guidance), device=self.device)
        return cond

    def unconditional(self, count: int) -> Conditioning:
        """`count` copies of the family's negative prompt: the unconditional half of classifier-free guidance."""
        return self.encode([self.family.negative_prompt] * count)

    @contextlib.contextmanager
    def _text_encoders_visiting(self) -> Iterator[None]:
        """With `offload_text_encoders`: the text encoders on `device` for the block, back on
        `text_encoder_home` (the CPU) after it, also when encoding fails. Otherwise nothing moves."""
        if not self.offload_text_encoders:
            yield
            return
        try:
            for encoder in self.text_encoders.values():
                encoder.to(self.device)
            yield
        finally:
            for encoder in self.text_encoders.values():
                encoder.to(self.text_encoder_home)

    # ---- model ---------------------------------------------------------------------------------
    def velocity(
        self,
        x: torch.Tensor,
        sigma: torch.Tensor,
        cond: Conditioning,
        *,
        transformer: nn.Module | None = None,
        cfg_scale: float = 1.0,
        uncond: Conditioning | None = None,
        detach_uncond: bool = False,
    ) -> torch.Tensor:
        """v(x_σ, σ | c); with cfg_scale ≠ 1: the family's guidance (`Family.guide`, v_u + s·(v_c − v_u)
        unless the family's pipeline says otherwise) against the family's negative prompt. `detach_uncond`:
        v_u enters the guidance without its gradient (Flow-GRPO's training forward)."""
        model = self.transformer if transformer is None else transformer
        if cfg_scale == 1.0:
            return self.family.velocity(model, x, sigma, cond)
        if uncond is None:
            raise ValueError("cfg_scale != 1 needs the unconditional (negative prompt) conditioning")
        both = self.family.collate([uncond, cond])
        v_u, v_c = self.family.velocity(model, torch.cat([x, x]), torch.cat([sigma, sigma]), both).chunk(2)
        return self.family.guide(v_u.detach() if detach_uncond else v_u, v_c, cfg_scale)

    def sigmas(self, steps: int, shift: float | None = None) -> torch.Tensor:
        """The policy's σ grid of `steps` steps: the family's for this latent shape (`shift` overrides the
        policy's), or the unshifted linspace (`sigma_grid = "linspace"`, which takes no shift)."""
        if self.sigma_grid == "linspace":
            if shift is not None:
                raise ValueError(f"this policy walks the unshifted linspace grid; got shift {shift}")
            return linspace_sigmas(steps)
        return self.family.sigmas(steps, self.scheduler, self.latent_shape, self.shift if shift is None else shift)

    @torch.inference_mode()
    def sample(
        self,
        prompts: Sequence[str],
        seeds: Sequence[int],
        *,
        steps: int,
        solver: Solver = "euler",
        cfg_scale: float = 1.0,
        shift: float | None = None,
        transformer: nn.Module | None = None,
        return_states: bool = False,
        batch_size: int | None = None,
        noise_level: float = 0.7,
        span: tuple[int, int] | None = None,
        start: torch.Tensor | None = None,
    ) -> SampleResult:
        """Sample one latent per (prompt, seed) pair; x_1 comes from the seed alone.

        Batches of `batch_size` are sampled independently and concatenated, so results do not
        depend on how candidates are grouped (up to the kernels' own batch invariance).

        `span` = (a, b): only steps a..b of the `steps`-step grid, from `start` (the states at step a;
        None: the seeds' noise, a = 0); an adaptive explorer stops the pool early and continues part of
        it. Euler and flow_sde continue exactly; dpm2's multistep history restarts at a.
        """
        if len(prompts) != len(seeds):
            raise ValueError(f"got {len(prompts)} prompts for {len(seeds)} seeds: pass one prompt per seed")
        grid = self.sigmas(steps, shift)
        first, last = span or (0, steps)
        if not 0 <= first < last <= steps or (first > 0) != (start is not None):
            raise ValueError(f"span {span} of a {steps}-step grid: need 0 <= a < b <= steps, and start states "
                             "exactly when a > 0")
        sigmas = grid[first : last + 1]
        size = batch_size or len(seeds)
        results = [
            self._sample_batch(prompts[i : i + size], seeds[i : i + size], sigmas, solver, cfg_scale,
                               transformer, return_states, noise_level, first, float(grid[1]),
                               None if start is None else start[i : i + size])
            for i in range(0, len(seeds), size)
        ]
        if len(results) == 1:
            return results[0]
        states = None
        if return_states:
            states = [torch.cat([r.states[j] for r in results]) for j in range(len(sigmas))]  # type: ignore[index]
        log_probs = None if results[0].log_probs is None else torch.cat([r.log_probs for r in results])
        return SampleResult(x0=torch.cat([r.x0 for r in results]), sigmas=sigmas, states=states,
                            x0_prediction=torch.cat([r.x0_prediction for r in results]), log_probs=log_probs)

    def _sample_batch(self, prompts, seeds, sigmas, solver, cfg_scale, transformer, return_states, noise_level,
                      first_step, sigma_max, start):
        cond = self.encode(prompts)
        uncond = self.unconditional(len(prompts)) if cfg_scale != 1.0 else None
        noise = initial_noise(seeds, self.latent_shape, device=self.device) if start is None else start.to(self.device)

        def velocity(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
            return self.velocity(x, sigma.to(self.device), cond, transformer=transformer,
                                 cfg_scale=cfg_scale, uncond=uncond)

        def step_noise(step: int) -> torch.Tensor:
            return sde_noise(seeds, first_step + step, self.latent_shape, device=self.device)

        return sample_ode(velocity, noise, sigmas.to(self.device), solver, return_states=return_states,
                          step_noise=step_noise, noise_level=noise_level, sigma_max=sigma_max)

    # ---- images --------------------------------------------------------------------------------
    @torch.inference_mode()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Images in [0, 1], float32 [B, C, H, W] (`Family.decode`); with `sequential_decode`, one
        latent at a time, concatenated on the batch axis (the official option: the VAE decoder's
        activations at 1024 px dwarf the latents; images match the batched decode up to the kernels'
        batch-size-dependent rounding)."""
        if not self.sequential_decode or latents.shape[0] <= 1:
            return self.family.decode(self.components, latents)
        return torch.cat([self.family.decode(self.components, latents[i : i + 1]) for i in range(latents.shape[0])])
