"""Qwen-Image: `QwenImageTransformer2DModel`, a Qwen2.5-VL text encoder, packed 2×2 latents of a causal 3D VAE."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from diffusion.families.base import Conditioning, Family, QuantPolicy
from diffusion.families.flux import dynamic_shift_sigmas, pack_latents, packed_latent_shape, unpack_latents

# `QwenImagePipeline.__init__`: the chat template every prompt is wrapped in, and how many of its leading
# tokens (the system turn and "<|im_start|>user\n") are dropped from the encoder's output.
PROMPT_TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
    "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
    "<|im_start|>assistant\n"
)
TEMPLATE_DROP = 34
TOKENIZER_MAX_LENGTH = 1024  # `tokenizer_max_length`: prompt tokens after the dropped template


@dataclass(frozen=True)
class QwenImageFamily(Family):
    """Qwen-Image as diffusers' `QwenImagePipeline` runs it (`diffusers/pipelines/qwenimage/pipeline_qwenimage.py`).

    Prompts (`_get_qwen_prompt_embeds`, `encode_prompt`): the prompt is put in `PROMPT_TEMPLATE`,
    tokenized (truncated at 1024 + 34 tokens) and run through the Qwen2.5-VL language model with its
    attention mask; the last hidden state of the valid tokens, less the template's first 34, is the
    prompt's conditioning, cut to `max_sequence_length` tokens (the pipeline's call default, 512). A
    prompt encodes to its own length: `collate` pads a batch to its longest with zeros and carries the
    attention mask (`prompt_embeds_mask`, 1 on valid tokens) beside it, as the pipeline pads a batch;
    the transformer gets no mask when every token is valid (`encode_prompt` drops an all-ones mask).

    Velocity (`__call__`'s denoising loop): the image-shaped state is packed into 2×2-patch tokens
    (`_pack_latents`, the same permutation as FLUX's), timestep = σ (the pipeline passes scheduler
    timestep / 1000), `img_shapes` = (1, h/2, w/2) per sample, and the output is unpacked.

    Guidance (`__call__`, `do_true_cfg`): true CFG against the negative prompt, then each packed token's
    guided velocity is rescaled to the norm of its conditional one:
    v = c · ‖v_c‖ / ‖c‖ with c = v_u + s·(v_c − v_u), norms over a token's 4·C channels.

    σ grid: FLUX's construction (`dynamic_shift_sigmas`) with the folder's scheduler config, whose
    Qwen-Image values (max_shift 0.9 at 8192 tokens, exponential time shift, terminal σ 0.02) the
    scheduler applies itself.

    Latents: the VAE (`AutoencoderKLQwenImage`, one frame) downsamples by 2^len(temperal_downsample)
    (the pipeline's `vae_scale_factor`, 8); decode un-normalises per channel, z = x / (1/std) + mean
    with the VAE config's `latents_std` / `latents_mean`, decodes the frame and maps (y + 1) / 2.
    """

    max_sequence_length: int = 512  # QwenImagePipeline.__call__'s default
    default_sample_size: int = 128  # latent cells per side when no resolution is given (the pipeline's)

    def text_tokens(self) -> int:
        return self.max_sequence_length  # a prompt conditions with its own length, at most this

    def encode(self, components: Mapping[str, nn.Module], prompts: Sequence[str]) -> Conditioning:
        missing = [n for n in ("tokenizer", "text_encoder") if n not in components]
        if missing:
            raise ValueError(f"a Qwen-Image model folder needs {', '.join(missing)} (the Qwen2.5-VL text encoder)")
        tokenizer, encoder = components["tokenizer"], components["text_encoder"]
        texts = [PROMPT_TEMPLATE.format(p) for p in prompts]
        tokens = tokenizer(texts, max_length=TOKENIZER_MAX_LENGTH + TEMPLATE_DROP, padding=True, truncation=True,
                           return_tensors="pt").to(encoder.device)
        hidden = encoder(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask,
                         output_hidden_states=True).hidden_states[-1]
        valid = [h[m.bool()][TEMPLATE_DROP:][: self.max_sequence_length]
                 for h, m in zip(hidden, tokens.attention_mask, strict=True)]
        return self.collate([
            {"prompt_embeds": v[None].to(dtype=encoder.dtype),
             "prompt_embeds_mask": torch.ones(1, v.shape[0], dtype=torch.long, device=v.device)}
            for v in valid])

    def collate(self, conds: Sequence[Conditioning]) -> Conditioning:
        """Pad each prompt's tokens (and mask) with zeros to the batch's longest, then concatenate."""
        length = max(c["prompt_embeds"].shape[1] for c in conds)

        def padded(t: torch.Tensor) -> torch.Tensor:
            pad = t.new_zeros(t.shape[0], length - t.shape[1], *t.shape[2:])
            return torch.cat([t, pad], dim=1)

        return {k: torch.cat([padded(c[k]) if k in ("prompt_embeds", "prompt_embeds_mask") else c[k] for c in conds])
                for k in conds[0]}

    def velocity(
        self, transformer: nn.Module, x: torch.Tensor, sigma: torch.Tensor, cond: Conditioning
    ) -> torch.Tensor:
        prompt_embeds, mask = cond["prompt_embeds"], cond["prompt_embeds_mask"]
        dtype, device = prompt_embeds.dtype, x.device
        batch, _, height, width = x.shape
        out = transformer(
            hidden_states=pack_latents(x).to(dtype),
            timestep=sigma.to(device=device, dtype=dtype),
            encoder_hidden_states=prompt_embeds,
            encoder_hidden_states_mask=None if bool(mask.all()) else mask,
            img_shapes=[[(1, height // 2, width // 2)]] * batch,
            return_dict=False,
        )[0]
        return unpack_latents(out, height, width)

    def guide(self, v_uncond: torch.Tensor, v_cond: torch.Tensor, scale: float) -> torch.Tensor:
        combined = pack_latents(v_uncond + scale * (v_cond - v_uncond))
        cond_norm = torch.norm(pack_latents(v_cond), dim=-1, keepdim=True)
        _, _, height, width = v_cond.shape
        return unpack_latents(combined * (cond_norm / torch.norm(combined, dim=-1, keepdim=True)), height, width)

    def vae_scale(self, components: Mapping[str, Any]) -> int:
        vae = components.get("vae")
        return 2 ** len(vae.config.temperal_downsample) if vae is not None else 8

    def latent_shape(self, components: Mapping[str, Any], resolution: int | None) -> tuple[int, int, int]:
        """`packed_latent_shape` (`QwenImagePipeline.check_inputs` / `prepare_latents`)."""
        return packed_latent_shape(components["transformer"].config, self.vae_scale(components), resolution,
                                   self.default_sample_size)

    def image_tokens(self, latent_shape: tuple[int, int, int], transformer_config: Any) -> int:
        """One token per 2×2 patch: the pipeline packs (`in_channels` = 4·C) and the transformer's own
        `patch_size` (2) describes that packing, not a second one."""
        _, h, w = latent_shape
        return (h // 2) * (w // 2)

    def sigmas(self, steps: int, scheduler: Mapping[str, Any], latent_shape: tuple[int, int, int],
               shift: float | None = None) -> torch.Tensor:
        _, h, w = latent_shape
        return dynamic_shift_sigmas(steps, scheduler, (h // 2) * (w // 2), shift)

    def decode(self, components: Mapping[str, Any], latents: torch.Tensor) -> torch.Tensor:
        vae = components["vae"]
        config = vae.config
        shape = (1, config.z_dim, 1, 1, 1)
        mean = torch.tensor(config.latents_mean).view(shape).to(latents.device, vae.dtype)
        inverse_std = 1.0 / torch.tensor(config.latents_std).view(shape).to(latents.device, vae.dtype)
        z = latents.to(vae.dtype)[:, :, None] / inverse_std + mean
        images = vae.decode(z, return_dict=False)[0][:, :, 0]
        return ((images.float() + 1.0) / 2.0).clamp_(0.0, 1.0)


QWEN_IMAGE = QwenImageFamily(
    name="qwen_image",
    transformer_class="QwenImageTransformer2DModel",
    # The official rules' criteria (SD3.5's: embedders, norms and the modulation kept, min_dim = the width):
    # the embedders (img_in, txt_in, time_text_embed), the AdaLN modulations (img_mod, txt_mod, norm_out) and
    # the output projection stay in high precision, and so does every layer no wider than the model's
    # width (3072: the attention projections); the image- and text-stream FFNs of the 60 blocks run in low
    # precision (tests/diffusion/test_layer_rule.py lists them on the published config).
    quant=QuantPolicy(skip=("img_in", "txt_in", "time_text_embed", "img_mod", "txt_mod", "norm_out", "proj_out"),
                      min_dim=3072),
    # The attention projections and FFNs of both streams, in diffusers' module names (those of the hub's
    # diffusers-format Qwen-Image LoRAs, `QwenImageLoraLoaderMixin`): yifan123/flow_grpo's Qwen-Image
    # LoRA targets (`scripts/train_qwenimage_edit_plus.py`, `target_modules`).
    lora_targets=(
        "attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
        "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out",
        "img_mlp.net.0.proj", "img_mlp.net.2", "txt_mlp.net.0.proj", "txt_mlp.net.2",
    ),
    text_components=("text_encoder", "tokenizer"),
    # The pipeline guides only against a given negative prompt; its documentation and flow_grpo's
    # rollouts pass " ".
    negative_prompt=" ",
)
