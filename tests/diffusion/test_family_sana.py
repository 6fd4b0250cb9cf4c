"""The SANA family on the tiny SANA pipeline (`diffusion.tiny.sana`): saved with diffusers' own
`save_pretrained`, loaded by `load_policy`, it must reproduce `SanaPipeline`'s prompt encoding (with
its default complex human instruction), sampling and decoding, sample with DPM and through the NVFP4
explore engine (1×1 convolutions included), and expose LoRA targets that exist in the transformer."""

from __future__ import annotations

import copy

import pytest
import torch
from diffusers import SanaPipeline

from diffusion.config import ExploreConfig
from diffusion.explore import ExploreEngine
from diffusion.families import SANA
from diffusion.families.sana import pipeline_default
from diffusion.loading import check_model_folder, load_policy
from diffusion.noise import candidate_seeds, initial_noise
from diffusion.quant.layer_rule import is_conv1x1

PROMPTS = ["A photo of a red cat ", "a sign that says seven"]
RESOLUTION = 32  # pixels: 8×8 latent cells of 4 channels (the tiny DC-AE has 3 levels: 4 px per cell)


@pytest.fixture(scope="module")
def sana(tiny_folder):
    """(folder, diffusers pipeline, loaded policy) of the tiny SANA pipeline."""
    folder = tiny_folder("sana")
    pipe: SanaPipeline = tiny_folder.pipeline("sana")
    pipe.set_progress_bar_config(disable=True)
    return folder, pipe, load_policy(folder)


def _pipeline(pipe: SanaPipeline, noise: torch.Tensor, output_type: str, **kwargs) -> torch.Tensor:
    """SanaPipeline at the tiny resolution, resolution binning off, its other defaults (CHI included)."""
    call = dict(num_inference_steps=4, guidance_scale=1.0) | kwargs
    return pipe(PROMPTS, latents=noise.clone(), height=RESOLUTION, width=RESOLUTION, use_resolution_binning=False,
                output_type=output_type, **call).images


def test_folder_is_small_valid_and_loads_as_sana(sana):
    folder, _, policy = sana
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    assert size < 2_000_000, f"the tiny SANA folder is {size} bytes"
    check_model_folder(folder)
    assert policy.family.name == "sana" and policy.family is SANA
    assert SANA.vae_scale(policy.components) == 4 and policy.latent_shape == (4, 8, 8)
    assert load_policy(folder, resolution=64).latent_shape == (4, 16, 16)


def test_prompt_encoding_is_the_pipelines_row_for_row(sana):
    _, pipe, policy = sana
    assert pipeline_default("complex_human_instruction")  # the pipeline uses its CHI by default
    embeds, mask, _, _ = pipe.encode_prompt(
        PROMPTS, do_classifier_free_guidance=False,
        complex_human_instruction=list(pipeline_default("complex_human_instruction")),
    )
    policy.components["tokenizer"].padding_side = "left"  # Gemma's default: the family pads right regardless
    cond = policy.encode(PROMPTS)  # one prompt at a time, through the policy's cache
    length = pipeline_default("max_sequence_length")
    assert cond["prompt_embeds"].shape == (2, length, 16) and cond["encoder_attention_mask"].shape == (2, length)
    torch.testing.assert_close(cond["prompt_embeds"], embeds.detach(), rtol=0, atol=1e-6)
    assert torch.equal(cond["encoder_attention_mask"], mask)
    # <bos>, the instruction's last token, then the prompt's words: right padding, then cut to length
    assert cond["encoder_attention_mask"].sum(1).tolist() == [2 + 6, 2 + 5]
    # the empty prompt is the pipeline's negative prompt: no instruction, max_sequence_length tokens
    _, _, negative, negative_mask = pipe.encode_prompt(["x"], do_classifier_free_guidance=True)
    empty = policy.encode([""])
    torch.testing.assert_close(empty["prompt_embeds"], negative.detach(), rtol=0, atol=1e-6)
    assert torch.equal(empty["encoder_attention_mask"], negative_mask)
    mixed = SANA.encode(policy.components, ["", PROMPTS[1]])
    torch.testing.assert_close(mixed["prompt_embeds"], torch.cat([empty["prompt_embeds"], cond["prompt_embeds"][1:]]),
                               rtol=0, atol=1e-6)


def test_sampling_and_decoding_match_the_sana_pipeline(sana):
    _, pipe, policy = sana
    seeds = candidate_seeds(0, 0, 0, len(PROMPTS))
    noise = initial_noise(seeds, policy.latent_shape)
    ours = policy.sample(PROMPTS, seeds, steps=4).x0
    torch.testing.assert_close(ours, _pipeline(pipe, noise, "latent"), rtol=0, atol=1e-5)
    images = policy.decode(ours)
    assert images.shape == (2, 3, RESOLUTION, RESOLUTION)
    torch.testing.assert_close(images, _pipeline(pipe, noise, "pt"), rtol=0, atol=1e-5)


def test_cfg_matches_the_pipeline_guidance(sana):
    _, pipe, policy = sana
    seeds = candidate_seeds(0, 0, 1, len(PROMPTS))
    noise = initial_noise(seeds, policy.latent_shape)
    ours = policy.sample(PROMPTS, seeds, steps=3, cfg_scale=4.5).x0
    theirs = _pipeline(pipe, noise, "latent", num_inference_steps=3, guidance_scale=4.5)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


def test_timestep_scale_is_applied_as_the_pipeline_does(sana):
    """SANA-1.5/Sprint-style configs scale the timestep; the pipeline, not the transformer, applies it."""
    folder, pipe, _ = sana
    policy = load_policy(folder)
    scaled = copy.deepcopy(pipe.transformer)
    for transformer in (scaled, policy.transformer):
        transformer.register_to_config(timestep_scale=0.5)
    reference = SanaPipeline(tokenizer=pipe.tokenizer, text_encoder=pipe.text_encoder, vae=pipe.vae,
                             transformer=scaled, scheduler=pipe.scheduler)
    reference.set_progress_bar_config(disable=True)
    seeds = candidate_seeds(0, 0, 2, len(PROMPTS))
    noise = initial_noise(seeds, policy.latent_shape)
    ours = policy.sample(PROMPTS, seeds, steps=2).x0
    torch.testing.assert_close(ours, _pipeline(reference, noise, "latent", num_inference_steps=2), rtol=0, atol=1e-5)
    assert not torch.allclose(ours, _pipeline(pipe, noise, "latent", num_inference_steps=2))


def test_sigma_grid_takes_the_schedulers_shift(sana):
    _, pipe, policy = sana
    pipe.scheduler.set_timesteps(5)
    torch.testing.assert_close(policy.sigmas(5), pipe.scheduler.sigmas.float(), rtol=0, atol=0)
    # the diffusers SANA releases hold a DPM scheduler whose shift is called flow_shift
    dpm = {"_class_name": "DPMSolverMultistepScheduler", "flow_shift": 3.0, "use_flow_sigmas": True}
    assert torch.equal(SANA.sigmas(5, dpm, policy.latent_shape), policy.sigmas(5))
    assert not torch.equal(SANA.sigmas(5, dpm, policy.latent_shape, shift=1.0), policy.sigmas(5))


def test_the_sol_rl_recipes_grid_is_the_unshifted_linspace_in_every_sampler(sana):
    """`model.sigma_grid=linspace` (the SANA preset): NVlabs/Sana's SANA Sol-RL sampler walks linspace(1, 0, N + 1)
    whatever the scheduler's shift; the policy samples on it (Euler: one velocity per grid step)."""
    from diffusion.config import ModelConfig
    from diffusion.loading import load_policy_from_config

    folder, _, policy = sana
    config = ModelConfig(path=str(folder), sigma_grid="linspace")
    linspace = load_policy_from_config(config)
    assert torch.equal(linspace.sigmas(5), torch.tensor([1.0, 0.8, 0.6, 0.4, 0.2, 0.0]))
    assert not torch.equal(policy.sigmas(5), linspace.sigmas(5))  # the scheduler's grid (shift, σ_min)
    seeds = candidate_seeds(0, 0, 2, len(PROMPTS))
    result = linspace.sample(PROMPTS, seeds, steps=5, return_states=True)
    assert torch.equal(result.sigmas, linspace.sigmas(5))
    x, cond = initial_noise(seeds, linspace.latent_shape), linspace.encode(PROMPTS)
    for i in range(5):  # Euler by hand on the linspace grid
        sigma = linspace.sigmas(5)
        x = x + (sigma[i + 1] - sigma[i]) * linspace.velocity(x, sigma[i].expand(len(seeds)), cond)
    torch.testing.assert_close(result.x0, x, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match=r"model\.sigma_grid=linspace is unshifted, but model\.shift is 3\.0"):
        ModelConfig(path=str(folder), sigma_grid="linspace", shift=3.0)
    from cluster.config.loading import load_config

    assert load_config("configs/sana_1600m.yaml").model.sigma_grid == "linspace"


def test_dpm_sampling_gives_finite_images(sana):
    _, _, policy = sana
    seeds = candidate_seeds(0, 0, 3, len(PROMPTS))
    result = policy.sample(PROMPTS, seeds, steps=3, solver="dpm2")
    images = policy.decode(result.x0)
    assert torch.isfinite(result.x0).all() and torch.isfinite(images).all()
    # the tiny SANA's velocities are small (its outputs move the noise by ~1e-6), so the two solvers differ by
    # ~5e-7: below allclose's tolerance, whose verdict then turns on rounding (the thread count); not equal at all
    assert not torch.equal(result.x0, policy.sample(PROMPTS, seeds, steps=3).x0)


def test_nvfp4_engine_quantizes_linears_and_1x1_convs(sana):
    _, _, policy = sana
    engine = ExploreEngine(policy, ExploreConfig(precision="nvfp4", min_dim=0, allow_emulation=True))
    convs = engine.plan.convs
    assert convs and all(is_conv1x1(policy.transformer.get_submodule(name)) for name in convs)
    # the GLUMBConv 1×1 convolutions of both blocks (the 3×3 depthwise conv is not a candidate)
    assert {name.rsplit(".", 1)[-1] for name in convs} == {"conv_inverted", "conv_point"} and len(convs) == 4
    assert not any(pattern in name for name in engine.plan.layers for pattern in SANA.quant.skip)
    assert any(".attn2." in name for name in engine.plan.linears)
    seeds = candidate_seeds(0, 0, 4, len(PROMPTS))
    full = policy.sample(PROMPTS, seeds, steps=3).x0
    low = policy.sample(PROMPTS, seeds, steps=3, transformer=engine.module).x0
    assert torch.isfinite(low).all() and torch.isfinite(policy.decode(low)).all()
    assert not torch.allclose(low, full)
    # the official flag taken literally (explore.conv1x1=false): Linears only, every conv in high precision
    linears_only = ExploreEngine(policy, ExploreConfig(precision="nvfp4", min_dim=0, allow_emulation=True,
                                                       conv1x1=False))
    assert linears_only.plan.convs == () and linears_only.plan.linears == engine.plan.linears


def test_lora_targets_match_the_transformers_modules(sana):
    _, _, policy = sana
    names = [name for name, _ in policy.transformer.named_modules()]
    for target in SANA.lora_targets:
        matches = [name for name in names if name.endswith("." + target)]
        assert len(matches) == policy.transformer.config.num_layers, target
        assert all(isinstance(policy.transformer.get_submodule(n), torch.nn.Linear) for n in matches), target
    # peft (as the learner attaches its adapters) wraps exactly these layers
    from peft import LoraConfig
    from peft.tuners.tuners_utils import BaseTunerLayer

    transformer = copy.deepcopy(policy.transformer)
    transformer.add_adapter(LoraConfig(r=2, lora_alpha=2, target_modules=list(SANA.lora_targets)))
    wrapped = [name for name, module in transformer.named_modules() if isinstance(module, BaseTunerLayer)]
    assert len(wrapped) == len(SANA.lora_targets) * transformer.config.num_layers
