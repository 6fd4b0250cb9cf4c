"""A tiny, complete SD3.5 pipeline: CLIP-L + CLIP-G + T5 (word tokenizers), 16-channel VAE, shift 3."""

from __future__ import annotations

import torch
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

from diffusion.tiny.tokenizer import word_tokenizer

CLIP_TOKENS = 12


def _clip(vocab: int, width: int, seed: int) -> CLIPTextModelWithProjection:
    torch.manual_seed(seed)
    config = CLIPTextConfig(
        vocab_size=vocab, hidden_size=width, intermediate_size=2 * width, projection_dim=width,
        num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=CLIP_TOKENS,
        pad_token_id=0, bos_token_id=2, eos_token_id=3,
    )
    return CLIPTextModelWithProjection(config).eval()


def build_sd3(seed: int = 0) -> StableDiffusion3Pipeline:
    """SD3.5's components at toy sizes (transformer 2 blocks, width 16; 16×16 px images, 2×2 latents
    per patch); every weight seeded from `seed`."""
    tokenizer = word_tokenizer(CLIP_TOKENS)
    vocab = len(tokenizer)
    torch.manual_seed(seed)
    t5 = T5EncoderModel(T5Config(vocab_size=vocab, d_model=32, d_ff=37, d_kv=8, num_layers=2, num_heads=4,
                                 decoder_start_token_id=0)).eval()
    torch.manual_seed(seed + 1)
    transformer = SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=16, out_channels=16, num_layers=2, attention_head_dim=8,
        num_attention_heads=2, joint_attention_dim=32, caption_projection_dim=16, pooled_projection_dim=24,
        pos_embed_max_size=8,
    ).eval()
    torch.manual_seed(seed + 2)
    vae = AutoencoderKL(block_out_channels=(8, 16), in_channels=3, out_channels=3, latent_channels=16,
                        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                        norm_num_groups=8, sample_size=16, shift_factor=0.0609, scaling_factor=1.5305).eval()
    return StableDiffusion3Pipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=vae,
        text_encoder=_clip(vocab, 16, seed + 3), tokenizer=tokenizer,
        text_encoder_2=_clip(vocab, 8, seed + 4), tokenizer_2=word_tokenizer(CLIP_TOKENS),
        text_encoder_3=t5, tokenizer_3=word_tokenizer(128, bos=False),
    )
