"""Model families: what differs between SD3, FLUX and SANA, and nothing else.

A family knows how to turn prompts into the transformer's conditioning, how to call its transformer
for a velocity, and which modules stay in high precision in the low-precision engine (the skip lists
and minimum sizes of the Sol-RL configs). Everything else — loading, noise, samplers, rewards, the
learner — is family-agnostic and goes through this interface.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

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

    def encode(self, components: Mapping[str, nn.Module], prompts: Sequence[str]) -> Conditioning:
        raise NotImplementedError(f"model family {self.name!r} is not supported yet: {self.note}")

    def velocity(
        self, transformer: nn.Module, x: torch.Tensor, sigma: torch.Tensor, cond: Conditioning
    ) -> torch.Tensor:
        raise NotImplementedError(f"model family {self.name!r} is not supported yet: {self.note}")


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
FLUX = Family(
    name="flux",
    transformer_class="FluxTransformer2DModel",
    # FLUX.1-dev: 495 of its 504 Linears run in NVFP4 (every block layer, and proj_out).
    quant=QuantPolicy(skip=("x_embedder", "context_embedder", "time_text_embed", "norm_out"), min_dim=1000),
    lora_targets=("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0"),
    supported=False,
    note="FLUX.1 prompt encoding (CLIP pooled + T5) and latent packing come in a later issue",
)
SANA = Family(
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
        conv1x1=True,  # the official SANA script replaces 1×1 convs too (train_nft_sana.py)
    ),
    lora_targets=("attn.qkv", "attn.proj", "cross_attn.q_linear", "cross_attn.kv_linear", "cross_attn.proj"),
    supported=False,
    note="SANA (Gemma text encoder, attention masks) comes in a later issue",
)

FAMILIES: dict[str, Family] = {f.name: f for f in (SD3, FLUX, SANA)}


def family_for_transformer(class_name: str) -> Family:
    """The family whose transformer class is `class_name`."""
    for family in FAMILIES.values():
        if family.transformer_class == class_name:
            return family
    known = ", ".join(f"{f.transformer_class} ({f.name})" for f in FAMILIES.values())
    raise ValueError(f"no model family for transformer class {class_name!r}; known: {known}")
