"""The config tree: presets, overrides, and errors that name the field and the fix."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from engines import quantized_layer_names
from pydantic import ValidationError

from cluster.config.loading import ConfigError, load_config
from cluster.config.schema import SolRLConfig
from diffusion.config import ExploreConfig, SamplerConfig
from diffusion.explore import ExploreEngine, explore_plan
from learner.config import RULE_ERROR, TrainerConfig
from learner.fidelity import fidelity, hit_rate, tolerant_hit_rate


def test_embedded_preset_loads_with_overrides():
    config = load_config("configs/embedded.yaml", ["explore.precision=fp8", "run.seed=3", "prompts.keep=12"])
    assert config.explore.precision == "fp8" and config.run.seed == 3 and config.prompts.keep == 12
    assert config.explore.steps == 6 and config.sampler.steps == 10 and config.model.path == "embedded"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("explore.precision=int3",
         r"explore\.precision: Input should be 'auto', 'nvfp4', 'nvfp4_w4a16', 'fp8', 'fp8_tensor' or 'none'"),
        ("explore.stepz=3", r"explore\.stepz: unknown field"),
        ("sampler.steps=0", r"sampler\.steps: Input should be greater than or equal to 1"),
        ("sampler.solver=heun", r"sampler\.solver: Input should be 'euler', 'dpm2' or 'flow_sde'"),
        ("reward.weights={no_such_reward: 1.0}", r"reward\.weights: .*unknown reward.*digit_alignment"),
        ("explore.precision", r"write it as key\.path=value"),
    ],
)
def test_bad_config_fails_naming_the_field(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("configs/embedded.yaml", [override])


def test_missing_preset_is_named():
    with pytest.raises(ConfigError, match=r"config file nowhere\.yaml does not exist"):
        load_config("nowhere.yaml")


def _one_line_error(path, overrides=()) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, list(overrides))
    assert "\n" not in str(info.value)
    return str(info.value)


def test_yaml_syntax_errors_name_the_file_line_and_column_in_one_line(tmp_path):
    preset = tmp_path / "x.yaml"
    preset.write_text("run:\n  seed: 0\nexplore:\n  steps: 6\n  solver: [euler\n  precision: fp8\n")
    assert re.fullmatch(r"\S+/x\.yaml line 6, column 12: expected ',' or '\]', but got ':' \(while parsing a flow "
                        r"sequence from line 5\); fix the YAML syntax there", _one_line_error(preset))
    preset.write_text("run:\n  seed: 0\n   name: x\n")
    assert re.fullmatch(r"\S+/x\.yaml line 3, column 8: mapping values are not allowed here; fix the YAML syntax "
                        r"there", _one_line_error(preset))
    assert "<unicode string>" not in _one_line_error(preset)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("explore.steps=[1,", r"--set explore\.steps=\[1,: expected the node content, but found '<stream end>' "
                              r"\(while parsing a flow node\); quote the value or fix its syntax"),
        ('run.name="abc', r"--set run\.name=\"abc: found unexpected end of stream \(while scanning a quoted "
                          r"scalar\); quote the value or fix its syntax"),
        ("reward.weights={a: 1", r"--set reward\.weights=\{a: 1: expected ',' or '\}', but got '<stream end>' "
                                 r"\(while parsing a flow mapping\); quote the value or fix its syntax"),
    ],
)
def test_yaml_syntax_errors_in_a_set_value_are_one_line(override, message):
    assert re.fullmatch(message, _one_line_error("configs/embedded.yaml", [override]))


def test_invalid_values_in_a_preset_name_the_line_of_their_key(tmp_path):
    preset = tmp_path / "x.yaml"
    preset.write_text("run:\n  seed: 0\nexplore:\n  precision: fp8\n  steps: 0\nprompts:\n  keep: 30\n"
                      "  candidates: 24\n")
    assert _one_line_error(preset) == f"{preset} line 5: explore.steps: Input should be greater than or equal to 1 " \
                                      "(given 0)"
    assert _one_line_error(preset, ["explore.steps=2"]) == (
        f"{preset} line 7: prompts.keep (30) must be <= prompts.candidates (24): keep is how many of the candidates "
        "are regenerated")
    # A value given with --set is named by the field the user typed, not by a line of the preset it replaced.
    assert _one_line_error(preset, ["explore.steps=-1", "prompts.keep=3"]) == (
        "explore.steps: Input should be greater than or equal to 1 (given -1)")
    preset.write_text("explore:\n  stepz: 3\n")
    assert _one_line_error(preset) == f"{preset} line 2: explore.stepz: unknown field (given 3); check the spelling " \
                                      "against the docs"


def test_several_problems_are_joined_into_one_line_and_the_tree_is_never_printed():
    message = _one_line_error("configs/embedded.yaml", ["explore.stepz=3", "sampler.steps=0"])
    assert message.split("; ", 1)[0] == "sampler.steps: Input should be greater than or equal to 1 (given 0)"
    assert "explore.stepz: unknown field (given 3)" in message
    message = _one_line_error("configs/embedded.yaml", ["prompts.candidates=8"])
    assert message == ("configs/embedded.yaml line 29: prompts.keep (24) must be <= prompts.candidates (8): keep is "
                       "how many of the candidates are regenerated")
    assert "{" not in message and "invalid configuration" not in message


def test_the_trainers_rules_hold_for_the_trainer_config_alone_and_come_before_the_clusters():
    """The rules across the trainer's sections live with `TrainerConfig` (the single-process trainer's
    tree); `SolRLConfig` adds those involving `cluster.*` after them: the first broken rule is the error."""
    with pytest.raises(ValidationError) as info:
        TrainerConfig.model_validate({"prompts": {"keep": 30, "candidates": 24}})
    [error] = info.value.errors()
    assert error["type"] == RULE_ERROR and error["ctx"]["fields"] == ("prompts.keep", "prompts.candidates")
    message = _one_line_error("configs/embedded.yaml", ["prompts.keep=200", "cluster.codec=lora", "training.mode=full"])
    assert message.startswith("configs/embedded.yaml line 28: prompts.keep (200) must be <= prompts.candidates (96)")


def test_the_explore_solver_is_decided_in_one_place():
    """`TrainerConfig.explore_solver`: explore.solver, else the sampler's. Validation records it in the tree
    (so config.yaml names it) without changing the section it was handed; a config built without validation
    gets the same answer from the property."""
    given = ExploreConfig()
    config = SolRLConfig(explore=given, sampler=SamplerConfig(solver="dpm2"))
    assert config.explore.solver == config.explore_solver == "dpm2" and given.solver is None
    assert config.model_copy(update={"explore": given}).explore_solver == "dpm2"
    assert load_config("configs/embedded.yaml", ["sampler.solver=dpm2", "explore.solver=euler"]).explore_solver == \
        "euler"


def test_a_preset_that_is_a_folder_or_not_a_mapping_is_refused(tmp_path):
    assert _one_line_error(tmp_path) == (f"config file {tmp_path} is a directory; name a YAML preset, e.g. "
                                         "configs/embedded.yaml")
    (tmp_path / "list.yaml").write_text("- run\n- model\n")
    assert _one_line_error(tmp_path / "list.yaml") == (f"{tmp_path / 'list.yaml'}: the top level must be a mapping of "
                                                       "sections (given a list)")
    (tmp_path / "latin1.yaml").write_bytes(b"run:\n  name: caf\xe9\n")
    assert _one_line_error(tmp_path / "latin1.yaml") == (f"config file {tmp_path / 'latin1.yaml'} is not UTF-8 text "
                                                         "(byte 0xe9 at line 2); save it as UTF-8")
    (tmp_path / "comments.yaml").write_text("# nothing but a comment\n")
    assert load_config(tmp_path / "comments.yaml").run.name == "embedded"


def test_embedded_engine_quantizes_the_ffn_as_sd35_large_does(embedded_policy):
    """min_dim 64 is the embedded model's width, as 2432 is SD3.5-L's: under the official rule every
    width-sized Linear (attention, projections) stays high precision and only the 4× wider image-stream
    FFN runs in NVFP4 (ff_context is on the SD3 skip list)."""
    config = load_config("configs/embedded.yaml")
    engine = ExploreEngine(embedded_policy, config.explore)
    expected = [f"transformer_blocks.{i}.ff.{layer}" for i in range(4) for layer in ("net.0.proj", "net.2")]
    assert quantized_layer_names(engine.module) == list(engine.plan.layers) == expected
    assert engine.plan.quantized_weights == tuple(f"{name}.weight" for name in expected)
    plain = config.explore.model_copy(update={"precision": "none"})
    assert quantized_layer_names(ExploreEngine(embedded_policy, plain).module) == []
    assert explore_plan(embedded_policy, plain).layers == ()


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


def test_launch_refuses_a_bad_config_before_ray_starts(capsys, tmp_path, own_ray):
    """`own_ray`: the process's shared Ray is down first, so `is_initialized` says what the launcher did."""
    import ray

    from cluster import launch

    assert launch.main(["--set", "explore.precision=int3", "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "explore.precision: Input should be 'auto', 'nvfp4', 'nvfp4_w4a16', 'fp8', 'fp8_tensor' or 'none'" in err
    assert not ray.is_initialized() and not (tmp_path / "r").exists()
    assert launch.main(["--resume", str(tmp_path / "nothing")]) == 2
    assert "no config.yaml there" in capsys.readouterr().err
    # A format this CPU can only emulate, asked for by name: refused in the backend row, nothing started.
    assert launch.main(["--set", "explore.precision=fp8", "--run-dir", str(tmp_path / "e")]) == 2
    out = capsys.readouterr().out
    refused = [line for line in out.splitlines() if line.startswith("FAIL  backend")]
    assert len(refused) == 1 and "explore.allow_emulation=true" in refused[0]
    assert not ray.is_initialized() and not (tmp_path / "e").exists()


def test_print_config_shows_the_resolved_config_and_starts_nothing(tmp_path, capsys, monkeypatch):
    import yaml

    from cluster import launch

    monkeypatch.chdir(tmp_path)  # a run directory would appear here (runs/…): none may
    repo = Path(__file__).resolve().parents[2]
    assert launch.main(["--print-config", "--config", str(repo / "configs/embedded.yaml"),
                        "--set", "prompts.keep=6", "--set", "cluster.explorers.count=3"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    expected = load_config(repo / "configs/embedded.yaml", ["prompts.keep=6", "cluster.explorers.count=3"])
    assert printed == expected.model_dump(mode="json") and printed["prompts"]["keep"] == 6
    assert list(tmp_path.iterdir()) == []
    preset = str(repo / "configs/embedded.yaml")
    assert launch.main(["--print-config", "--config", preset, "--set", "prompts.keep=0"]) == 2
    assert "prompts.keep" in capsys.readouterr().err


def test_the_config_reference_in_the_docs_is_the_schema():
    """docs/config.md's tables are generated (`python -m cluster.config.reference`): stale, this fails."""
    from cluster.config.reference import CONFIG_DOC, current

    doc = CONFIG_DOC.read_text()
    assert current(doc) == doc, "docs/config.md is stale: run python -m cluster.config.reference"
    for path in ("learner.objective", "sampler.solver", "sampler.sde_noise_level", "explore.schedule",
                 "explore.halving_steps", "explore.batch_size", "learner.grpo.clip_range", "learner.decay.ramp_steps",
                 "cluster.explorers.join_timeout_s", "logging.wandb.project"):
        assert f"| `{path}` |" in doc, path
    for option in ("processor_path", "tokenizer_path", "clip_path"):
        assert f"`{option}`" in doc, option


def test_a_preset_states_only_its_differences_from_its_base(tmp_path):
    """configs/embedded_art.yaml is embedded.yaml plus what its comment says; a base that loops is refused."""
    def flat(tree: dict, prefix: str = "") -> dict:
        out = {}
        for key, value in tree.items():
            out.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key: value})
        return out

    base, art = (flat(load_config(f"configs/{name}.yaml").model_dump(mode="json"))
                 for name in ("embedded", "embedded_art"))
    assert {k: art[k] for k in art if art[k] != base[k]} == {
        "run.name": "embedded_art", "learner.objective": "art", "learner.decay.type": 0, "eval.every": 5,
        "cluster.explorers.threads": 1, "cluster.learner.threads": 1}
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match="leads back to itself"):
        load_config(tmp_path / "a.yaml")


@pytest.mark.parametrize("module", ["cluster.launch", "cluster.check", "cluster.export", "cluster.evaluate",
                                    "bench.demo"])
def test_each_commands_help_names_it_and_explains_every_flag(module, capsys):
    import importlib

    with pytest.raises(SystemExit):
        importlib.import_module(module).main(["--help"])
    text = capsys.readouterr().out
    assert text.startswith(f"usage: python -m {module}")
    lines = text[text.index("\noptions:"):].splitlines()[1:]
    for i, line in enumerate(lines):
        if line.startswith("  -") and not line.startswith("  -h"):
            flags, _, helptext = line.strip().partition("  ")
            described = helptext.strip() or (i + 1 < len(lines) and lines[i + 1].startswith(" " * 8)
                                              and not lines[i + 1].strip().startswith("-"))
            assert described, f"{module}: {flags} has no help text"
