"""A tiny, complete SANA pipeline: Gemma-2 text encoder (word tokenizer), DC-AE latents, Euler flow scheduler.

The architecture is diffusers' `SanaPipeline` at toy sizes, as diffusers' own SANA pipeline test builds
its dummy components (`tests/pipelines/sana/test_sana.py`, `get_dummy_components`): a
`SanaTransformer2DModel` (linear self-attention, masked cross-attention, GLUMBConv feed-forward with
its 1×1 convolutions), a `Gemma2Model` text encoder, an `AutoencoderDC` and a
`FlowMatchEulerDiscreteScheduler` (the official Sol-RL SANA recipe samples with Euler on flow σ).

Call the pipeline with `use_resolution_binning=False`: its default bins the size to SANA's aspect-ratio
tables, which exist only for transformer sample sizes 16, 32, 64 and 128 (512 to 4096 px).
"""

from __future__ import annotations

import torch
from diffusers import AutoencoderDC, FlowMatchEulerDiscreteScheduler, SanaPipeline, SanaTransformer2DModel
from tokenizers import processors
from transformers import Gemma2Config, Gemma2Model, PreTrainedTokenizerFast

from diffusion.tiny.tokenizer import word_tokenizer

# Long enough for the pipeline's default complex human instruction (≈200 word tokens with the tiny
# tokenizer) plus its 300-token prompt budget; Gemma-2's own limit is 8192.
GEMMA_TOKENS = 8192
TEXT_WIDTH = 16  # the Gemma hidden size, the transformer's caption_channels


def gemma_like_tokenizer() -> PreTrainedTokenizerFast:
    """A word tokenizer that behaves like Gemma's where SanaPipeline relies on it: `<bos>` first and no
    `<eos>` (Gemma's `add_bos_token=True, add_eos_token=False`), and left padding by default (Gemma's
    `padding_side`), which `SanaPipeline._get_gemma_prompt_embeds` switches to right padding."""
    tokenizer = word_tokenizer(GEMMA_TOKENS)
    bos = tokenizer.bos_token
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, tokenizer.bos_token_id)]
    )
    tokenizer.padding_side = "left"
    return tokenizer


def build_sana(seed: int = 0) -> SanaPipeline:
    """SANA's components at toy sizes (transformer 2 blocks, width 16; a 3-level DC-AE, so 4 px per
    latent cell and 32×32 px images from 8×8 latents); every weight seeded from `seed`."""
    tokenizer = gemma_like_tokenizer()
    torch.manual_seed(seed)
    text_encoder = Gemma2Model(Gemma2Config(
        vocab_size=len(tokenizer), hidden_size=TEXT_WIDTH, intermediate_size=32, head_dim=8,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=GEMMA_TOKENS,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )).eval()
    torch.manual_seed(seed + 1)
    transformer = SanaTransformer2DModel(
        in_channels=4, out_channels=4, num_layers=2, num_attention_heads=2, attention_head_dim=8,
        num_cross_attention_heads=2, cross_attention_head_dim=8, cross_attention_dim=16,
        caption_channels=TEXT_WIDTH, sample_size=8, patch_size=1,
    ).eval()
    torch.manual_seed(seed + 2)
    vae = AutoencoderDC(
        in_channels=3, latent_channels=4, attention_head_dim=2,
        encoder_block_types=("ResBlock", "ResBlock", "EfficientViTBlock"),
        decoder_block_types=("ResBlock", "ResBlock", "EfficientViTBlock"),
        encoder_block_out_channels=(8, 8, 8), decoder_block_out_channels=(8, 8, 8),
        encoder_qkv_multiscales=((), (), (5,)), decoder_qkv_multiscales=((), (), (5,)),
        encoder_layers_per_block=(1, 1, 1), decoder_layers_per_block=(1, 1, 1),
        downsample_block_type="conv", upsample_block_type="interpolate",
        decoder_norm_types="rms_norm", decoder_act_fns="silu", scaling_factor=0.41407,
    ).eval()
    return SanaPipeline(
        tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
    )
