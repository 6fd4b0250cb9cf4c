"""SANA (the diffusers-format release): `SanaTransformer2DModel`, Gemma-2 text encoder, DC-AE latents."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from diffusion.families.base import Conditioning, Family, QuantPolicy


@functools.cache
def pipeline_default(name: str) -> Any:
    """The default of `SanaPipeline.__call__`'s argument `name` (the complex human instruction, the
    prompt length), read from diffusers itself so that the family follows the installed pipeline."""
    from diffusers import SanaPipeline

    default = inspect.signature(SanaPipeline.__call__).parameters[name].default
    return tuple(default) if isinstance(default, list) else default


@dataclass(frozen=True)
class SanaFamily(Family):
    """SANA as diffusers' `SanaPipeline` runs it (`diffusers/pipelines/sana/pipeline_sana.py`).

    Prompts (`_get_gemma_prompt_embeds` and `encode_prompt`, `clean_caption=False`): each prompt is
    lower-cased and stripped; the pipeline's default complex human instruction (CHI, its lines joined
    by newlines) is prepended; the text is tokenized with right padding to
    `n_chi + max_sequence_length − 2` tokens (n_chi: the CHI's token count with special tokens),
    truncated, and run through Gemma-2 with its attention mask; the last hidden state and the mask
    are then cut to `max_sequence_length` positions: position 0 (`<bos>`) and the last
    `max_sequence_length − 1`. The mask travels in the conditioning (`encoder_attention_mask`).
    Padding to a fixed length makes a prompt's encoding independent of the batch it comes in.

    The empty prompt is encoded as the pipeline encodes its default negative prompt "" (no CHI, no
    cut, `max_sequence_length` tokens): the policy's classifier-free guidance uses "" as the
    unconditional prompt, and this is what `SanaPipeline` pairs with each prompt under guidance.

    Velocity (`__call__`'s denoising loop): timestep = 1000·σ (the flow scheduler's timesteps) times
    the transformer config's `timestep_scale` — the pipeline applies that scale, not the transformer;
    latents go in image-shaped; the output is cast to float32 and, for a learned-σ transformer
    (out_channels = 2·in_channels), its first half is the velocity.

    Latents: DC-AE downsamples by 2^(len(encoder_block_out_channels) − 1) (the pipeline's
    `vae_scale_factor`, 32 without a VAE); decode is `vae.decode(x / scaling_factor)` (no shift
    factor) then the image processor's `y · 0.5 + 0.5` clamped to [0, 1].
    """

    max_sequence_length: int = 300  # SanaPipeline.__call__'s default
    complex_human_instruction: bool = True  # SanaPipeline.__call__ uses its CHI by default

    def text_tokens(self) -> int:
        return self.max_sequence_length

    def _gemma(self, components: Mapping[str, nn.Module], texts: list[str], max_length: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """`_get_gemma_prompt_embeds` after the CHI: Gemma-2's last hidden state and the attention mask."""
        tokenizer, encoder = components["tokenizer"], components["text_encoder"]
        # Gemma's tokenizer pads on the left; the pipeline sets right padding before every encode
        # (here per call, leaving the shared tokenizer as loaded).
        inputs = tokenizer(texts, padding="max_length", max_length=max_length, truncation=True,
                           add_special_tokens=True, padding_side="right", return_tensors="pt")
        mask = inputs.attention_mask.to(encoder.device)
        embeds = encoder(inputs.input_ids.to(encoder.device), attention_mask=mask)[0]
        return embeds.to(dtype=encoder.dtype), mask

    def _encode_group(self, components: Mapping[str, nn.Module], prompts: list[str], chi: bool) -> Conditioning:
        """`encode_prompt` for prompts that all take the CHI (`chi`) or all do not (the negative prompt)."""
        texts = [p.lower().strip() for p in prompts]  # _text_preprocessing with clean_caption=False
        length = self.max_sequence_length
        if not chi:  # max_sequence_length tokens, where the cut below keeps every position
            embeds, mask = self._gemma(components, texts, length)
        else:
            instruction = "\n".join(pipeline_default("complex_human_instruction"))
            instruction_tokens = len(components["tokenizer"].encode(instruction))
            embeds, mask = self._gemma(components, [instruction + t for t in texts], instruction_tokens + length - 2)
        # encode_prompt ("See Section 3.1. of the paper"): <bos> and the last max_sequence_length − 1 positions.
        keep = [0, *range(-length + 1, 0)]
        return {"prompt_embeds": embeds[:, keep], "encoder_attention_mask": mask[:, keep]}

    def encode(self, components: Mapping[str, nn.Module], prompts: Sequence[str]) -> Conditioning:
        if "text_encoder" not in components or "tokenizer" not in components:
            raise ValueError("a SANA model folder needs text_encoder/ (Gemma-2) and tokenizer/")
        # The empty prompt is the pipeline's negative prompt: encoded without the CHI.
        with_chi = [self.complex_human_instruction and p != "" for p in prompts]
        groups = {flag: [i for i, f in enumerate(with_chi) if f == flag] for flag in set(with_chi)}
        parts = {flag: self._encode_group(components, [prompts[i] for i in rows], flag)
                 for flag, rows in groups.items()}
        if len(parts) == 1:
            return next(iter(parts.values()))
        order = torch.tensor([i for rows in groups.values() for i in rows]).argsort()
        return {key: torch.cat([part[key] for part in parts.values()])[order.to(parts[True][key].device)]
                for key in parts[True]}

    def velocity(
        self, transformer: nn.Module, x: torch.Tensor, sigma: torch.Tensor, cond: Conditioning
    ) -> torch.Tensor:
        config = transformer.config
        dtype = cond["prompt_embeds"].dtype  # the transformer's dtype: one dtype for every component
        # The scheduler's timesteps are 1000·σ; SanaPipeline (not the transformer) applies timestep_scale.
        timestep = sigma * 1000.0 * config.timestep_scale
        v = transformer(
            x.to(dtype),
            encoder_hidden_states=cond["prompt_embeds"].to(dtype),
            encoder_attention_mask=cond["encoder_attention_mask"],
            timestep=timestep,
            return_dict=False,
        )[0].float()
        if config.out_channels // 2 == config.in_channels:  # learned σ: the velocity is the first half
            v = v.chunk(2, dim=1)[0]
        return v

    def sigmas(self, steps: int, scheduler: Mapping[str, Any], latent_shape: tuple[int, int, int],
               shift: float | None = None) -> torch.Tensor:
        """The FlowMatchEuler grid (`Family.sigmas`; what SanaPipeline walks with a
        `FlowMatchEulerDiscreteScheduler`, and the official Sol-RL SANA recipe's Euler on flow σ).
        The shift is `shift`, else the scheduler's `shift`, else its `flow_shift`: the diffusers SANA
        releases ship a `DPMSolverMultistepScheduler(use_flow_sigmas=True, flow_shift=...)`, whose own
        grid is not used (the samplers here are Euler and DPM on this grid)."""
        if shift is None and "shift" not in scheduler:
            shift = float(scheduler.get("flow_shift", 1.0))
        return super().sigmas(steps, scheduler, latent_shape, shift)

    def vae_scale(self, components: Mapping[str, Any]) -> int:
        """DC-AE: 2^(len(encoder_block_out_channels) − 1) (`SanaPipeline.vae_scale_factor`; 32 without a VAE)."""
        vae = components.get("vae")
        return 2 ** (len(vae.config.encoder_block_out_channels) - 1) if vae is not None else 32

    def decode(self, components: Mapping[str, Any], latents: torch.Tensor) -> torch.Tensor:
        """Images in [0, 1]: `vae.decode(x / scaling_factor)` (DC-AE has no shift factor), then
        `PixArtImageProcessor.postprocess`'s denormalisation `(y · 0.5 + 0.5).clamp(0, 1)`."""
        vae = components["vae"]
        images = vae.decode(latents.to(vae.dtype) / vae.config.scaling_factor, return_dict=False)[0]
        return (images.float() * 0.5 + 0.5).clamp_(0.0, 1.0)


SANA = SanaFamily(
    name="sana",
    transformer_class="SanaTransformer2DModel",
    quant=QuantPolicy(
        skip=(
            # The official list names the native SANA model's modules ...
            "t_embedder", "t_block", "cfg_embedder", "y_embedder", "x_embedder",
            "final_layer", "logvar_linear", "attn.qkv",
            # ... and these are the same modules in diffusers' SanaTransformer2DModel: t_embedder,
            # t_block and cfg_embedder live in time_embed, y_embedder is caption_projection,
            # x_embedder patch_embed, final_layer proj_out, attn.qkv attn1.to_{q,k,v}.
            "time_embed", "caption_projection", "patch_embed", "proj_out",
            "attn1.to_q", "attn1.to_k", "attn1.to_v",
        ),
        min_dim=2240,
        # Not the source's flag, its layers: NVlabs/Sana `train_scripts/sol_rl/train_sana.py` calls
        # `replace_linear_with_te(m, skip_modules, min_dim)` without `replace_conv1x1` on its native LinearFFN
        # model, whose FFN Linears (2240 → 11200, 5600 → 2240) are the only layers past min_dim. diffusers'
        # SANA runs that FFN as 1×1 convs and has no Linear past min_dim: Linears only would quantize nothing
        # (tests/diffusion/test_layer_rule.py). `explore.conv1x1=false` is the source's flag literally.
        conv1x1=True,
    ),
    # The official targets name native SANA modules (attn.qkv, attn.proj, cross_attn.q_linear,
    # cross_attn.kv_linear, cross_attn.proj); in diffusers' SanaTransformer2DModel the fused self-
    # attention qkv is split into attn1.to_q/to_k/to_v and its proj is attn1.to_out.0, the cross-
    # attention q_linear is attn2.to_q, the fused kv_linear attn2.to_k/to_v, and proj attn2.to_out.0.
    lora_targets=(
        "attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0",
        "attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.to_out.0",
    ),
    text_components=("text_encoder", "tokenizer"),
)
