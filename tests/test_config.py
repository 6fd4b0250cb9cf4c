"""The config tree: presets, overrides, and errors that name the field and the fix."""

from __future__ import annotations

import numpy as np
import pytest

from cluster.config import ConfigError, load_config
from diffusion.explore import build_explore_engine
from diffusion.quant import quantized_layer_names
from learner.fidelity import fidelity, hit_rate, tolerant_hit_rate


def test_embedded_preset_loads_with_overrides():
    config = load_config("configs/embedded.yaml", ["explore.precision=fp8", "run.seed=3", "prompts.keep=12"])
    assert config.explore.precision == "fp8" and config.run.seed == 3 and config.prompts.keep == 12
    assert config.explore.steps == 6 and config.sampler.steps == 10 and config.model.path == "embedded"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("explore.precision=int3", r"explore\.precision: Input should be 'nvfp4', 'nvfp4_w4a16', 'fp8' or 'none'"),
        ("explore.stepz=3", r"explore\.stepz: unknown field"),
        ("sampler.steps=0", r"sampler\.steps: Input should be greater than or equal to 1"),
        ("sampler.solver=heun", r"sampler\.solver: Input should be 'euler' or 'dpm2'"),
        ("reward.weights={pickscore: 1.0}", r"reward\.weights: .*unknown reward.*digit_alignment"),
        ("explore.precision", r"write it as key\.path=value"),
    ],
)
def test_bad_config_fails_naming_the_field(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("configs/embedded.yaml", [override])


def test_missing_preset_is_named():
    with pytest.raises(ConfigError, match=r"config file nowhere\.yaml does not exist"):
        load_config("nowhere.yaml")


def test_explore_engine_follows_the_family_skip_list_and_min_dim(embedded_policy):
    config = load_config("configs/embedded.yaml")
    names = quantized_layer_names(build_explore_engine(embedded_policy, config.explore))
    assert names, "the embedded engine must quantize something"
    skipped = ("pos_embed", "context_embedder", "time_text_embed", "norm_out", "norm1", "ff_context")
    assert not [n for n in names if any(s in n.split(".") for s in skipped)]
    assert "proj_out" not in names  # 64 → 4: below min_dim 64
    assert {"transformer_blocks.0.attn.to_q", "transformer_blocks.0.ff.net.0.proj"} <= set(names)
    none = build_explore_engine(embedded_policy, config.explore.model_copy(update={"precision": "none"}))
    assert quantized_layer_names(none) == []


def test_hit_rates_and_rank_correlations_on_known_rankings():
    reference = np.arange(20, dtype=np.float64)[None, :]
    assert hit_rate(reference[0], reference[0], 4) == 1.0
    swapped = reference.copy()
    swapped[0, [15, 16]] = swapped[0, [16, 15]]  # swap ranks 4 and 5 from the top
    assert hit_rate(swapped[0], reference[0], 4) == 0.75 and hit_rate(swapped[0], reference[0], 8) == 1.0
    reversed_ = -reference
    metrics = fidelity(reversed_, reference)
    assert metrics["spearman"] == pytest.approx(-1.0) and metrics["kendall"] == pytest.approx(-1.0)
    assert metrics["hit@12"] == pytest.approx(4 / 12)  # top-12 of 20 and bottom-12 share 4
    assert fidelity(reference, reference)["bottom_hit@12"] == 1.0


def test_tolerant_hit_counts_swaps_among_near_ties():
    reference = np.array([0.0, -0.001, -0.002, -0.5, -1.0, -2.0])
    proxy = np.array([0.1, 0.0, 0.3, 0.2, -3.0, -4.0])  # top-2 by proxy: indices 2 and 3
    assert hit_rate(proxy, reference, 2) == 0.0
    assert tolerant_hit_rate(proxy, reference, 2, tolerance=0.01) == 0.5  # index 2 ties the 2nd best
    assert tolerant_hit_rate(proxy, reference, 2, tolerance=0.6) == 1.0


def test_launch_refuses_a_bad_config_before_ray_starts(capsys, tmp_path):
    import ray

    from cluster import launch

    assert launch.main(["--set", "explore.precision=int3", "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "explore.precision: Input should be 'nvfp4', 'nvfp4_w4a16', 'fp8' or 'none'" in err
    assert not ray.is_initialized() and not (tmp_path / "r").exists()
    assert launch.main(["--resume", str(tmp_path / "nothing")]) == 2
    assert "no config.yaml there" in capsys.readouterr().err
