"""FLUX.1 (dev): `FluxTransformer2DModel`, CLIP-L pooled + T5, packed 2×2 latents, distilled guidance."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from diffusion.families.base import Conditioning, Family, QuantPolicy


def pack_latents(x: torch.Tensor) -> torch.Tensor:
    """[B, C, h, w] → [B, (h/2)·(w/2), 4C]: each 2×2 patch becomes one token, channel-major within the
    token (c, dy, dx), tokens row-major over patches — diffusers' `FluxPipeline._pack_latents`."""
    b, c, h, w = x.shape
    if h % 2 or w % 2:
        raise ValueError(f"FLUX latents need an even height and width, got {h}×{w}")
    return x.reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // 2) * (w // 2), c * 4)


def unpack_latents(tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """The inverse of `pack_latents` for latents of `height`×`width` cells (`FluxPipeline._unpack_latents`)."""
    b, _, d = tokens.shape
    c = d // 4
    return tokens.reshape(b, height // 2, width // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, height, width)


def packed_latent_shape(transformer_config: Any, vae_scale: int, resolution: int | None, default_size: int
                        ) -> tuple[int, int, int]:
    """(in_channels / 4, h, h) for a transformer on packed 2×2 patches (FLUX, Qwen-Image): a token holds 4 latent
    channels' patch and h must be even, so `resolution` must be a multiple of 2·vae_scale (the pipelines warn
    and round down instead). None: the pipeline's `default_size` cells per side."""
    if resolution is None:
        size = default_size
    elif resolution % (2 * vae_scale):
        raise ValueError(f"resolution {resolution} must be a multiple of {2 * vae_scale} (2 × the VAE's scale)")
    else:
        size = resolution // vae_scale
    return (transformer_config.in_channels // 4, size, size)


def latent_image_ids(height: int, width: int, *, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """RoPE positions of the packed tokens, [(h/2)·(w/2), 3]: (0, patch row, patch column) for latents of
    `height`×`width` cells — `FluxPipeline._prepare_latent_image_ids` on the patch grid."""
    rows, cols = height // 2, width // 2
    ids = torch.zeros(rows, cols, 3)
    ids[..., 1] = torch.arange(rows)[:, None]
    ids[..., 2] = torch.arange(cols)[None, :]
    return ids.reshape(rows * cols, 3).to(device=device, dtype=dtype)


def dynamic_shift_sigmas(steps: int, scheduler: Mapping[str, Any], tokens: int, shift: float | None = None
                         ) -> torch.Tensor:
    """The σ grid of `FluxPipeline.__call__` (and `QwenImagePipeline.__call__`, which builds it the same
    way), made by diffusers' own scheduler from the folder's config so it matches bit for bit:
    `set_timesteps(sigmas=linspace(1, 1/steps, steps), mu=calculate_shift(tokens, ...))` with the config's
    base/max shift and sequence lengths (and whatever else the config sets: Qwen-Image's exponential time
    shift and terminal σ); `tokens` is the packed image token count. `shift` given: that static shift
    instead of the dynamic one."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift

    config = dict(scheduler)
    if shift is not None:
        if shift <= 0:
            raise ValueError(f"shift must be > 0, got {shift}")
        config.update(shift=float(shift), use_dynamic_shifting=False)
    flow = FlowMatchEulerDiscreteScheduler.from_config(config)
    mu = None
    if flow.config.use_dynamic_shifting:
        mu = calculate_shift(
            tokens,
            flow.config.get("base_image_seq_len", 256),
            flow.config.get("max_image_seq_len", 4096),
            flow.config.get("base_shift", 0.5),
            flow.config.get("max_shift", 1.15),
        )
    flow.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
    return flow.sigmas.to(torch.float32).clone()


@dataclass(frozen=True)
class FluxFamily(Family):
    """FLUX.1 (`FluxTransformer2DModel`), as diffusers' `FluxPipeline` runs it.

    Prompts (`FluxPipeline.encode_prompt`): the CLIP text encoder's pooled output (`tokenizer`,
    padded to its `model_max_length`) is `pooled_projections`; the T5 encoder's last hidden states
    (`tokenizer_2`, padded to `t5_max_sequence_length`) are `prompt_embeds`; text positions are zeros.
    T5 prompts are 128 tokens, as the official Sol-RL FLUX script encodes them
    (`train_scripts/sol_rl/train_flux1.py`: `TEXT_ENCODER_MAX_SEQ_LEN = 128`; the pipeline's default is 512).

    Velocity: the sampler's image-shaped state is packed into 2×2-patch tokens, the transformer gets
    timestep = σ (the pipeline passes scheduler timestep / 1000, the official script σ itself), the
    distilled guidance `cond["guidance"]` when its config has `guidance_embeds`, and its output is
    unpacked back to [B, C, h, w].

    σ grid (`FluxPipeline.__call__`): sigmas = linspace(1, 1/steps, steps) given to the folder's
    `FlowMatchEulerDiscreteScheduler.set_timesteps` with mu = `calculate_shift` of the image's token
    count (resolution-dependent "dynamic" shift); an explicit `shift` replaces it by that static shift.
    """

    t5_max_sequence_length: int = 128
    default_sample_size: int = 128  # latent cells per side when no resolution is given (the pipeline's)

    def text_tokens(self) -> int:
        return self.t5_max_sequence_length

    def encode(self, components: Mapping[str, nn.Module], prompts: Sequence[str]) -> Conditioning:
        missing = [n for n in ("tokenizer", "text_encoder", "tokenizer_2", "text_encoder_2") if n not in components]
        if missing:
            raise ValueError(f"a FLUX model folder needs {', '.join(missing)} (CLIP pooled output and T5 states)")
        tokenizer, encoder = components["tokenizer"], components["text_encoder"]
        ids = tokenizer(
            list(prompts), padding="max_length", max_length=tokenizer.model_max_length, truncation=True,
            return_tensors="pt",
        ).input_ids.to(encoder.device)
        pooled = encoder(ids, output_hidden_states=False).pooler_output.to(dtype=encoder.dtype)
        tokenizer, encoder = components["tokenizer_2"], components["text_encoder_2"]
        ids = tokenizer(
            list(prompts), padding="max_length", max_length=self.t5_max_sequence_length, truncation=True,
            return_tensors="pt",
        ).input_ids.to(encoder.device)
        prompt_embeds = encoder(ids, output_hidden_states=False)[0].to(dtype=encoder.dtype)
        return {"prompt_embeds": prompt_embeds, "pooled_projections": pooled}

    def velocity(
        self, transformer: nn.Module, x: torch.Tensor, sigma: torch.Tensor, cond: Conditioning
    ) -> torch.Tensor:
        prompt_embeds = cond["prompt_embeds"]
        dtype, device = prompt_embeds.dtype, x.device
        _, _, height, width = x.shape
        guidance = None
        # FLUX.1-schnell has no guidance embedder; -dev needs one value per sample (the pipeline's float32).
        if getattr(getattr(transformer, "config", None), "guidance_embeds", False):
            if "guidance" not in cond:
                raise ValueError("this FLUX transformer takes a distilled guidance value: cond['guidance'] is missing")
            guidance = cond["guidance"].to(device=device, dtype=torch.float32)
        # txt_ids/img_ids are per-token, not per-sample: 2-D, as the transformer takes them.
        txt_ids = torch.zeros(prompt_embeds.shape[1], 3, device=device, dtype=dtype)
        out = transformer(
            hidden_states=pack_latents(x).to(dtype),
            timestep=sigma.to(device=device, dtype=dtype),
            guidance=guidance,
            pooled_projections=cond["pooled_projections"],
            encoder_hidden_states=prompt_embeds,
            txt_ids=txt_ids,
            img_ids=latent_image_ids(height, width, device=device, dtype=dtype),
            return_dict=False,
        )[0]
        return unpack_latents(out, height, width)

    def latent_shape(self, components: Mapping[str, Any], resolution: int | None) -> tuple[int, int, int]:
        """`packed_latent_shape` (`FluxPipeline.check_inputs` / `prepare_latents`)."""
        return packed_latent_shape(components["transformer"].config, self.vae_scale(components), resolution,
                                   self.default_sample_size)

    def sigmas(self, steps: int, scheduler: Mapping[str, Any], latent_shape: tuple[int, int, int],
               shift: float | None = None) -> torch.Tensor:
        """`dynamic_shift_sigmas` for this latent's packed token count."""
        _, h, w = latent_shape
        return dynamic_shift_sigmas(steps, scheduler, (h // 2) * (w // 2), shift)

FLUX = FluxFamily(
    name="flux",
    transformer_class="FluxTransformer2DModel",
    # FLUX.1-dev: 495 of its 504 Linears run in NVFP4 (every block layer, and proj_out).
    quant=QuantPolicy(skip=("x_embedder", "context_embedder", "time_text_embed", "norm_out"), min_dim=1000),
    lora_targets=("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0"),
    text_components=("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2"),
    # The official Sol-RL FLUX config samples with distilled guidance 1.0 for rollouts, training and
    # evaluation (`configs/sol_rl/flux1.py`, `_get_config`: *_sample_guidance_scale = 1.0, passed as
    # FLUX's guidance embedding by `pipeline_with_logprob_flux`); diffusers' FluxPipeline default is 3.5.
    default_guidance=1.0,
)
