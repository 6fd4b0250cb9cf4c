"""What a model family is: the parts of a text-to-image flow model that differ between SD3, FLUX, SANA and
Qwen-Image.

A family turns prompts into the transformer's conditioning, calls its transformer for a velocity,
says the sampler's latent shape and σ grid for a resolution, decodes latents to images, and names
which layers the low-precision engine replaces (the Sol-RL per-family skip lists and minimum sizes)
and which the LoRA adapters target. Everything else — loading, noise, samplers, rewards, the learner —
is family-agnostic and goes through this interface.

The sampler's state is always an image-shaped latent [B, C, h, w] (float32): the seed's noise, every
visited state and x0 keep that layout, so the objectives see one shape for every family. A family
whose transformer takes another layout (FLUX packs 2×2 patches into tokens) converts inside
`velocity`; packing is a permutation, so the ODE step is the same either way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from diffusion.samplers import flow_sigmas

Conditioning = dict[str, torch.Tensor]  # per-sample tensors, batch first


@dataclass(frozen=True)
class QuantPolicy:
    """Which layers the low-precision engine replaces (Sol-RL's per-family settings).

    The rule (`diffusion.quant.layer_rule`, the official `replace_linear_with_te`): a Linear (and,
    with `conv1x1`, a 1×1 convolution) is replaced unless a `skip` pattern is a substring of its
    qualified name or `min_dim > 0 and max(in, out) <= min_dim`.
    """

    skip: tuple[str, ...]  # substrings of qualified names kept in high precision
    min_dim: int  # layers with max(in, out) <= min_dim stay in high precision (0: no size limit)
    conv1x1: bool = False  # also replace 1×1 convolutions, run as Linears over channels (SANA)


@dataclass(frozen=True)
class Family:
    name: str
    transformer_class: str
    quant: QuantPolicy
    lora_targets: tuple[str, ...]
    supported: bool = True
    note: str = ""
    text_components: tuple[str, ...] = field(default=())
    default_guidance: float | None = None  # a distilled guidance input of the transformer (FLUX)
    negative_prompt: str = ""  # the unconditional prompt of classifier-free guidance

    def _unsupported(self) -> NotImplementedError:
        return NotImplementedError(f"model family {self.name!r} is not supported yet: {self.note}")

    # ---- prompts and the transformer -------------------------------------------------------------
    def encode(self, components: Mapping[str, nn.Module], prompts: Sequence[str]) -> Conditioning:
        """The transformer's conditioning for `prompts`, batch first."""
        raise self._unsupported()

    def velocity(
        self, transformer: nn.Module, x: torch.Tensor, sigma: torch.Tensor, cond: Conditioning
    ) -> torch.Tensor:
        """v(x_σ, σ | c) for image-shaped latents x [B, C, h, w] and σ [B] in [0, 1]."""
        raise self._unsupported()

    def collate(self, conds: Sequence[Conditioning]) -> Conditioning:
        """One batch from per-prompt conditionings (each batch first): concatenated on the batch axis.
        A family whose prompts encode to different lengths pads them here (Qwen-Image)."""
        return {k: torch.cat([c[k] for c in conds]) for k in conds[0]}

    def guide(self, v_uncond: torch.Tensor, v_cond: torch.Tensor, scale: float) -> torch.Tensor:
        """Classifier-free guidance of image-shaped velocities: v_u + s·(v_c − v_u)."""
        return v_uncond + scale * (v_cond - v_uncond)

    # ---- latents ----------------------------------------------------------------------------------
    def vae_scale(self, components: Mapping[str, Any]) -> int:
        """Pixels per latent cell: 2^(VAE levels − 1) for an AutoencoderKL, 1 without a VAE."""
        vae = components.get("vae")
        return 2 ** (len(vae.config.block_out_channels) - 1) if vae is not None else 1

    def latent_shape(self, components: Mapping[str, Any], resolution: int | None) -> tuple[int, int, int]:
        """(C, h, w) of one sample at `resolution` pixels (None: the transformer's sample size)."""
        config = components["transformer"].config
        scale = self.vae_scale(components)
        if resolution is not None and resolution % (scale * config.patch_size):
            raise ValueError(f"resolution {resolution} must be a multiple of {scale * config.patch_size}")
        size = config.sample_size if resolution is None else resolution // scale
        return (config.in_channels, size, size)

    def image_tokens(self, latent_shape: tuple[int, int, int], transformer_config: Any) -> int:
        """The transformer's image tokens for one latent: its cells grouped by the patch size (FLUX's 2×2
        packing shows in `in_channels`, 4 latent channels per token)."""
        channels, h, w = latent_shape
        return h * w * channels // (transformer_config.in_channels * transformer_config.patch_size**2)

    def text_tokens(self) -> int:
        """The text tokens the transformer attends to beside the image's, at most (memory estimates): one CLIP
        prompt's 77 unless the family says otherwise."""
        return 77

    def sigmas(self, steps: int, scheduler: Mapping[str, Any], latent_shape: tuple[int, int, int],
               shift: float | None = None) -> torch.Tensor:
        """The σ grid of `steps` steps (steps + 1 values ending at 0): diffusers' FlowMatchEuler grid
        with the scheduler's static shift, or `shift` when given."""
        return flow_sigmas(steps, float(scheduler.get("shift", 1.0)) if shift is None else shift)

    def decode(self, components: Mapping[str, Any], latents: torch.Tensor) -> torch.Tensor:
        """Images in [0, 1], float32 [B, 3 or 1, H, W].

        With a VAE: x / scaling_factor + shift_factor → VAE decoder → (y + 1) / 2. Without one the
        model works in pixel space (the embedded world): image = (x + 1) / 2.
        """
        vae = components.get("vae")
        if vae is None:
            return ((latents.float() + 1.0) / 2.0).clamp_(0.0, 1.0)
        config = vae.config
        z = latents.to(vae.dtype) / config.scaling_factor + (getattr(config, "shift_factor", None) or 0.0)
        images = vae.decode(z, return_dict=False)[0]
        return ((images.float() + 1.0) / 2.0).clamp_(0.0, 1.0)
