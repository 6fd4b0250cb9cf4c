"""SANA (the diffusers-format release): `SanaTransformer2DModel`, Gemma-2 text encoder, DC-AE latents."""

from __future__ import annotations

from diffusion.families.base import Family, QuantPolicy

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
