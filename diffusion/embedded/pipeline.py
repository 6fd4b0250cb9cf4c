"""The embedded model as a diffusers pipeline: `EmbeddedDigitsPipeline`, the `pipeline.py` of an exported
embedded folder.

No diffusers pipeline fits the embedded model: it has the SD3 transformer but one CLIP text encoder and no
VAE (it works in pixel space, x = 2·image − 1), and `StableDiffusion3Pipeline` needs two CLIP encoders and a
VAE. `cluster.export` therefore writes this file into the folder and names it in `model_index.json`
(`"_class_name": ["pipeline", "EmbeddedDigitsPipeline"]`), which is how diffusers loads a pipeline that
ships its own code:

    pipe = DiffusionPipeline.from_pretrained(folder, trust_remote_code=True)
    image = pipe("a handwritten digit seven", num_inference_steps=10).images[0]   # a 16×16 grayscale PIL image

It samples as `diffusion.policy.FlowPolicy` does for the SD3 family: the encoder's penultimate hidden states
(zero-padded to the transformer's width) and its projected pooled output, the scheduler's Euler steps with
timestep 1000·σ, classifier-free guidance against the empty prompt when `guidance_scale` > 1, and
image = (x + 1) / 2. diffusers copies this one file into its module cache and runs it, so it imports
only torch, diffusers and transformers — nothing of this project.
"""

from __future__ import annotations

import torch
from diffusers import DiffusionPipeline, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel
from diffusers.image_processor import VaeImageProcessor
from diffusers.pipelines.pipeline_utils import ImagePipelineOutput
from diffusers.utils.torch_utils import randn_tensor
from transformers import CLIPTextModelWithProjection, PreTrainedTokenizerFast


class EmbeddedDigitsPipeline(DiffusionPipeline):
    """Text to 16×16 grayscale digit images with the embedded model (see the module docstring)."""

    model_cpu_offload_seq = "text_encoder->transformer"

    def __init__(self, transformer: SD3Transformer2DModel, scheduler: FlowMatchEulerDiscreteScheduler,
                 text_encoder: CLIPTextModelWithProjection, tokenizer: PreTrainedTokenizerFast) -> None:
        super().__init__()
        self.register_modules(transformer=transformer, scheduler=scheduler, text_encoder=text_encoder,
                              tokenizer=tokenizer)
        # Pixel space: one latent cell is one pixel, and [-1, 1] maps to [0, 1] as a VAE's output would.
        self.image_processor = VaeImageProcessor(vae_scale_factor=1, do_normalize=True)

    @torch.no_grad()
    def encode_prompt(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(prompt_embeds [B, tokens, width], pooled_projections [B, width]) for the transformer."""
        ids = self.tokenizer(prompts, padding="max_length", max_length=self.tokenizer.model_max_length,
                             truncation=True, return_tensors="pt").input_ids.to(self._execution_device)
        out = self.text_encoder(ids, output_hidden_states=True)
        hidden = out.hidden_states[-2].to(self.text_encoder.dtype)
        width = self.transformer.config.joint_attention_dim
        return torch.nn.functional.pad(hidden, (0, width - hidden.shape[-1])), out[0]

    @torch.no_grad()
    def __call__(
        self,
        prompt: str | list[str],
        num_inference_steps: int = 10,
        guidance_scale: float = 1.0,
        height: int | None = None,
        width: int | None = None,
        num_images_per_prompt: int = 1,
        generator: torch.Generator | list[torch.Generator] | None = None,
        latents: torch.Tensor | None = None,
        output_type: str = "pil",
        return_dict: bool = True,
    ) -> ImagePipelineOutput | tuple:
        """Images for `prompt`; `latents` (the initial noise [B, 1, H, W]) replaces drawing it from `generator`."""
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        prompts = [p for p in prompts for _ in range(num_images_per_prompt)]
        config = self.transformer.config
        height, width = height or config.sample_size, width or config.sample_size
        if height % config.patch_size or width % config.patch_size:
            raise ValueError(f"height and width must be multiples of {config.patch_size}, got {height}×{width}")
        device = self._execution_device
        embeds, pooled = self.encode_prompt(prompts)
        guided = guidance_scale > 1.0
        if guided:  # one forward for both halves: [unconditional, conditional]
            empty, empty_pooled = self.encode_prompt([""] * len(prompts))
            embeds, pooled = torch.cat([empty, embeds]), torch.cat([empty_pooled, pooled])
        if latents is None:
            latents = randn_tensor((len(prompts), config.in_channels, height, width), generator=generator,
                                   device=device, dtype=torch.float32)
        latents = latents.to(device=device, dtype=torch.float32)  # the state stays float32, as in diffusers

        self.scheduler.set_timesteps(num_inference_steps, device=device)
        for t in self.progress_bar(self.scheduler.timesteps):
            x = torch.cat([latents, latents]) if guided else latents
            velocity = self.transformer(hidden_states=x.to(self.transformer.dtype), timestep=t.expand(x.shape[0]),
                                        encoder_hidden_states=embeds, pooled_projections=pooled,
                                        return_dict=False)[0].to(torch.float32)
            if guided:
                unconditional, conditional = velocity.chunk(2)
                velocity = unconditional + guidance_scale * (conditional - unconditional)
            latents = self.scheduler.step(velocity, t, latents, return_dict=False)[0]

        images = self.image_processor.postprocess(latents, output_type=output_type)
        self.maybe_free_model_hooks()
        return ImagePipelineOutput(images=images) if return_dict else (images,)
