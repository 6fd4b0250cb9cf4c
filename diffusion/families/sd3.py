"""Stable Diffusion 3 / 3.5 (Large and Medium): MMDiT `SD3Transformer2DModel`, CLIP-L + CLIP-G + T5-XXL."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from diffusion.families.base import Conditioning, Family, QuantPolicy


@dataclass(frozen=True)
class SD3Family(Family):
    """Stable Diffusion 3 / 3.5 (MMDiT, `SD3Transformer2DModel`).

    Prompt encoding follows `StableDiffusion3Pipeline.encode_prompt` (clip_skip None): each CLIP
    encoder present gives its penultimate hidden states and its projected pooled output; hidden
    states are concatenated on features and zero-padded to the T5 width, then T5 tokens follow on
    the sequence axis. T5 prompts are 128 tokens, as the official Sol-RL SD3 script encodes them
    (`TEXT_ENCODER_MAX_SEQ_LEN = 128`; the pipeline's own default is 256). Difference, on purpose: with
    no T5 encoder in the folder the pipeline appends zero tokens; here no T5 tokens are appended (the
    embedded model was trained that way, and real SD3.5 folders ship their T5).
    """

    t5_max_sequence_length: int = 128

    def text_tokens(self) -> int:
        return 77 + self.t5_max_sequence_length  # the CLIP tokens, then T5's

    def encode(self, components: Mapping[str, nn.Module], prompts: Sequence[str]) -> Conditioning:
        clip_pairs = [
            (components[tok], components[enc])
            for tok, enc in (("tokenizer", "text_encoder"), ("tokenizer_2", "text_encoder_2"))
            if enc in components
        ]
        if not clip_pairs:
            raise ValueError("an SD3 model folder needs at least text_encoder/ and tokenizer/")
        max_length = clip_pairs[0][0].model_max_length  # the pipeline uses the first tokenizer's length
        hidden, pooled = [], []
        for tokenizer, encoder in clip_pairs:
            ids = tokenizer(
                list(prompts), padding="max_length", max_length=max_length, truncation=True, return_tensors="pt"
            ).input_ids.to(encoder.device)
            out = encoder(ids, output_hidden_states=True)
            pooled.append(out[0])
            hidden.append(out.hidden_states[-2].to(dtype=encoder.dtype))
        clip_hidden = torch.cat(hidden, dim=-1)
        transformer_width = components["transformer"].config.joint_attention_dim
        if "text_encoder_3" in components:
            tokenizer, encoder = components["tokenizer_3"], components["text_encoder_3"]
            ids = tokenizer(
                list(prompts),
                padding="max_length",
                max_length=self.t5_max_sequence_length,
                truncation=True,
                add_special_tokens=True,
                return_tensors="pt",
            ).input_ids.to(encoder.device)
            t5_hidden = encoder(ids)[0].to(dtype=encoder.dtype)
            clip_hidden = nn.functional.pad(clip_hidden, (0, t5_hidden.shape[-1] - clip_hidden.shape[-1]))
            prompt_embeds = torch.cat([clip_hidden, t5_hidden], dim=-2)
        else:
            prompt_embeds = nn.functional.pad(clip_hidden, (0, transformer_width - clip_hidden.shape[-1]))
        return {"prompt_embeds": prompt_embeds, "pooled_projections": torch.cat(pooled, dim=-1)}

    def velocity(
        self, transformer: nn.Module, x: torch.Tensor, sigma: torch.Tensor, cond: Conditioning
    ) -> torch.Tensor:
        # SD3 transformers take timestep = 1000·σ (float), as the pipeline passes scheduler.timesteps.
        return transformer(
            hidden_states=x.to(cond["prompt_embeds"].dtype),
            timestep=sigma * 1000.0,
            encoder_hidden_states=cond["prompt_embeds"],
            pooled_projections=cond["pooled_projections"],
            return_dict=False,
        )[0]


SD3 = SD3Family(
    name="sd3",
    transformer_class="SD3Transformer2DModel",
    quant=QuantPolicy(
        skip=("pos_embed", "context_embedder", "time_text_embed", "norm_out", "norm1", "ff_context"),
        # 2432 is SD3.5-L's width: its 2432×2432 attention projections stay in high precision and the
        # image-stream FFN (ff.net.0.proj, ff.net.2 of 38 blocks: 76 Linears) runs in NVFP4.
        min_dim=2432,
    ),
    lora_targets=(
        "attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
        "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out",
    ),
    text_components=("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2", "text_encoder_3", "tokenizer_3"),
)
