"""Exports a diffusers user can load, checked with the real pipelines on each family's tiny model.

After one update of a tiny run: `final/transformer` loads with the family's transformer class and holds
θ as evaluated (its EMA); the family's pipeline with `final/lora` loaded and fused has the same
transformer weights and samples the same image as our sampler; `cluster.export` writes a folder that
`DiffusionPipeline.from_pretrained` loads.
"""

from __future__ import annotations

import shutil

import diffusers
import pytest
import torch
import yaml
from tiny import tiny_family_config

from cluster.export import main as export_main
from learner.export import merged_weights
from learner.rollouts import Sampling, generate
from learner.trainer import Trainer

FAMILIES = ["sd3", "flux", "sana", "qwen_image"]
PROMPT = "a red cat"


@pytest.fixture(scope="module", params=FAMILIES)
def trained(request, tiny_folder, tmp_path_factory):
    """(family, model folder, run dir, trainer) after one update with a non-trivial EMA."""
    family, folder = request.param, tiny_folder(request.param)
    run_dir = tmp_path_factory.mktemp(f"run_{family}")
    config = tiny_family_config(folder, "run.iterations=2", "training.lr=0.01")
    trainer = Trainer(config, run_dir)
    trainer.run(log=lambda _: None)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    trainer.save_final(run_dir / "final")
    return family, folder, run_dir, trainer


def transformer_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in module.state_dict().items()}


def test_the_run_resumes_bitwise_from_its_previous_checkpoint(trained, tmp_path):
    """The run kept its last two checkpoints: a fresh trainer from the one of iteration 1, run to 2, ends
    with the run's exact weights (EMA included)."""
    _, _, run_dir, trainer = trained
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    resumed = Trainer(trainer.config, copy)
    resumed.resume(copy / "checkpoint.previous")
    assert resumed.iteration == 1
    resumed.run(log=lambda _: None)
    a, b = merged_weights(trainer.state, "ema"), merged_weights(resumed.state, "ema")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_final_transformer_loads_with_the_family_class(trained):
    _, _, run_dir, trainer = trained
    cls = type(trainer.state.transformer)
    loaded = transformer_state(cls.from_pretrained(run_dir / "final" / "transformer"))
    expected = merged_weights(trainer.state, "ema")
    assert loaded.keys() == expected.keys() and all(torch.equal(loaded[k], expected[k]) for k in expected)
    theta = merged_weights(trainer.state, "theta")
    assert any(not torch.equal(theta[k], expected[k]) for k in expected), "the EMA must differ from θ here"


def test_the_exported_lora_fused_into_the_pipeline_gives_the_same_weights_and_image(trained):
    family, folder, run_dir, trainer = trained
    pipe = diffusers.DiffusionPipeline.from_pretrained(folder)
    pipe.load_lora_weights(run_dir / "final" / "lora")
    pipe.fuse_lora()
    pipe.unload_lora_weights()
    fused = transformer_state(pipe.transformer)
    final = transformer_state(type(pipe.transformer).from_pretrained(run_dir / "final" / "transformer"))
    assert fused.keys() == final.keys()
    assert max(float((fused[k] - final[k]).abs().max()) for k in final) <= 1e-5

    policy, sampling = trainer.policy, Sampling(3, "euler")
    with trainer.state.evaluated() as model:
        ours = generate(policy, model, None, PROMPT, [7], sampling, return_images=True).images
    noise = trainer.policy.latent_shape
    latents = torch.randn((1, *noise), generator=torch.Generator().manual_seed(7))
    images = pipeline_images(family, pipe, latents, policy)
    torch.testing.assert_close(images, ours, rtol=0, atol=1e-5)


def pipeline_images(family: str, pipe, latents: torch.Tensor, policy) -> torch.Tensor:
    """The pipeline's images for the initial noise `latents` (image-shaped, as our sampler draws it)."""
    size = latents.shape[-1] * policy.family.vae_scale(policy.components)
    kwargs = dict(num_inference_steps=3, height=size, width=size, output_type="pt", guidance_scale=1.0)
    if family == "flux":
        from diffusion.families.flux import pack_latents

        kwargs["guidance_scale"] = policy.guidance
        return pipe([PROMPT], latents=pack_latents(latents), max_sequence_length=policy.family.t5_max_sequence_length,
                    **kwargs).images
    if family == "sana":
        return pipe([PROMPT], latents=latents, use_resolution_binning=False, **kwargs).images
    if family == "qwen_image":
        from diffusion.families.flux import pack_latents

        del kwargs["guidance_scale"]  # Qwen-Image is not guidance-distilled; true CFG is off at 1
        return pipe([PROMPT], latents=pack_latents(latents), true_cfg_scale=1.0,
                    max_sequence_length=policy.family.max_sequence_length, **kwargs).images
    return pipe([PROMPT], latents=latents, max_sequence_length=128, **kwargs).images


def test_an_exported_lora_carries_the_gaussian_spread(trained):
    """A was drawn N(0, (1/r)²) (`training.lora_init: gaussian`, every official config's); after two small
    steps the exported A's spread is still 1/r within 10% (kaiming's 1/√(3·fan_in) is at most 0.58 of it at
    these widths, fan_in ≥ 16), and the file's adapter metadata names the init."""
    import json
    import math

    from safetensors import safe_open

    _, _, run_dir, trainer = trained
    rank = trainer.config.training.lora_rank
    with safe_open(run_dir / "final" / "lora" / "pytorch_lora_weights.safetensors", "pt") as file:
        a = [file.get_tensor(k) for k in file.keys() if ".lora_A." in k]  # noqa: SIM118 (safe_open is no dict)
        metadata = json.loads(file.metadata()["lora_adapter_metadata"])
    pooled = torch.cat([t.flatten() for t in a])
    assert metadata["transformer.init_lora_weights"] == "gaussian" and metadata["transformer.r"] == rank
    assert float(pooled.std()) == pytest.approx(1 / rank, rel=0.1)
    kaiming = max(1 / math.sqrt(3 * t.shape[1]) for t in a)
    assert kaiming < 0.75 / rank


def test_cluster_export_writes_a_loadable_pipeline(trained, tmp_path, capsys):
    _, _, run_dir, trainer = trained
    export_main(["--run-dir", str(run_dir), "--out", str(tmp_path / "pipe"), "--policy", "ema"])
    assert "pipeline folder" in capsys.readouterr().out
    pipe = diffusers.DiffusionPipeline.from_pretrained(tmp_path / "pipe")
    exported = transformer_state(pipe.transformer)
    expected = merged_weights(trainer.state, "ema")
    assert all(torch.equal(exported[k], expected[k]) for k in expected)
