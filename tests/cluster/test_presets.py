"""The presets (the paper's, and Qwen-Image on SD3.5-L's settings): each validates, carries the official
hyperparameters, and needs only its model path."""

from __future__ import annotations

import re

import pytest
from hub_cache import cache_repo, folder_files

from bench.plan import PAPER_SHAPE, best_split, paper_costs
from cluster.config.loading import ConfigError, load_config
from cluster.config.preflight import check_inputs
from diffusion.prompts import load_prompts

# preset → (model family, resolution, solver, trained-timestep fraction, grad clip, evaluation steps)
PRESETS = {
    "sd35_large": ("sd3", 1024, "dpm2", 0.6, 0.002, 40),
    "sd35_medium": ("sd3", 512, "dpm2", 0.99, 1.0, 40),  # DiffusionNFT's SD3.5-M config trains 0.99
    "flux_dev": ("flux", 512, "dpm2", 0.4, 1.0, 28),
    "sana_1600m": ("sana", 1024, "euler", 0.6, 1.0, 40),
    "qwen_image": ("qwen_image", 1024, "dpm2", 0.6, 0.002, 40),  # not in the paper: SD3.5-L's settings
}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_carries_the_official_hyperparameters(name):
    _, resolution, solver, fraction, clip, eval_steps = PRESETS[name]
    c = load_config(f"configs/{name}.yaml")
    assert (c.prompts.per_iteration, c.prompts.candidates, c.prompts.keep) == (48, 96, 24)
    assert (c.explore.steps, c.sampler.steps) == (6, 10)
    assert c.sampler.solver == c.explore.solver == solver  # the official solver in both stages
    assert c.learner.algorithm == "sol_rl" and c.learner.timestep_fraction == fraction
    assert (c.training.lr, c.training.grad_clip, c.training.lora_rank, c.training.lora_alpha) == (3e-4, clip, 32, 64)
    assert c.training.lora_targets is None and c.explore.skip is None and c.explore.min_dim is None  # the family's
    assert (c.eval.steps, c.training.ema, c.model.dtype, c.model.resolution) == (eval_steps, True, "bfloat16",
                                                                              resolution)
    assert c.explore.precision == "auto" and c.learner.decay.type == 1 and c.learner.nft.beta == 1.0
    # one 8-GPU node, one GPU per actor, split as bench.plan finds fastest in sync mode (streamed)
    learners, explorers = c.cluster.learner, c.cluster.explorers
    assert learners.count * learners.num_gpus + explorers.count * explorers.num_gpus == 8
    assert c.cluster.placement_strategy == "PACK" and c.cluster.mode == "sync" and c.cluster.stream_regeneration
    modeled = name if name != "sd35_medium" else "sd35_large"  # the paper gives no Medium costs: Large's split
    best = best_split(paper_costs(modeled), PAPER_SHAPE, 8, "sync", streamed=True)
    assert (explorers.count, learners.count) == (best.explorers, best.learners)
    assert len(load_prompts(c.prompts.source)) >= c.prompts.per_iteration
    assert len(load_prompts(c.prompts.eval_source, heldout=True)) >= c.eval.prompts


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_preset_runs_by_its_hub_ids_from_the_cache(name, tiny_folder, hub_cache):
    """Offline, each repo the preset names is asked for in turn, with its download command; once the cache
    holds them (the family's tiny pipeline under the preset's model id), the preflight passes as it is."""
    config = load_config(f"configs/{name}.yaml")
    assert config.reward.weights == {"hpsv2": 1.0}  # the paper's ablation reward
    assert config.reward.options["hpsv2"]["path"] == "xswu/HPSv2"
    with pytest.raises(ConfigError, match=r"^reward\.options\.hpsv2\.path: xswu/HPSv2 is not in the Hugging Face "
                                          r"cache .*`hf download xswu/HPSv2 --include HPS_v2\.1_compressed\.pt`"):
        check_inputs(config)
    cache_repo(hub_cache, "xswu/HPSv2", {"HPS_v2.1_compressed.pt": b""})  # the preflight checks presence only
    with pytest.raises(ConfigError, match=rf"^model\.path: {re.escape(config.model.path)} is not in the Hugging "
                                          r"Face cache .*`hf download "):
        check_inputs(config)
    cache_repo(hub_cache, config.model.path, folder_files(tiny_folder(PRESETS[name][0])))
    assert check_inputs(config).notes == []
