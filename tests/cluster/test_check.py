"""`python -m cluster.check`: every row on real folders, the exit codes, and what it names when a folder is
incomplete."""

from __future__ import annotations

import shutil

import pytest

from cluster.check import estimate_memory, main, meta_transformer, run_checks, stored_parameters
from cluster.config.loading import load_config
from diffusion.config import EMBEDDED_MODEL
from diffusion.families import family_for_transformer


def rows_by_check(config) -> dict:
    return {row.check: row for row in run_checks(config)}


def test_the_embedded_preset_passes_every_check(capsys):
    assert main(["--config", "configs/embedded.yaml"]) == 0
    out = capsys.readouterr().out
    assert out.count("ok  ") == 7  # inputs, resources, learners, backend, plan, memory, shm
    assert "ok    learners   8 slots on one learner rank: nothing to balance" in out
    # the official rule on the embedded model: its 4 blocks' 2 FFN Linears, 131 k of 582 k parameters
    assert "8 of 60 Linears in nvfp4: 0.1 M of 0.6 M transformer parameters (23%)" in out


@pytest.mark.parametrize("family", ["sd3", "flux", "sana", "qwen_image"])
def test_each_family_reports_its_layer_plan(family, tiny_folder):
    rows = rows_by_check(load_config("configs/embedded.yaml", [f"model.path={tiny_folder(family)}",
                                                               "prompts.source=configs/prompts/train.txt",
                                                               "reward.weights={jpeg_compressibility: 1.0}",
                                                               "explore.min_dim=0"]))
    assert all(row.ok for row in rows.values()), rows
    assert " in nvfp4: " in rows["plan"].detail
    assert ("1×1 convs" in rows["plan"].detail) == (family == "sana")


def test_an_incomplete_folder_is_named_and_fails(tiny_folder, tmp_path, capsys):
    folder = shutil.copytree(tiny_folder("flux"), tmp_path / "flux")
    shutil.rmtree(folder / "text_encoder_2")
    code = main(["--set", f"model.path={folder}", "--set", "reward.weights={jpeg_compressibility: 1.0}"])
    out, err = capsys.readouterr()
    assert code == 1 and "1 check(s) failed: inputs" in err
    assert f"FAIL  inputs     model.path: {folder / 'text_encoder_2'} is missing: component 'text_encoder_2'" in out


def test_a_preset_on_a_cpu_machine_warns_about_gpus_and_nothing_quantized_fails(tiny_folder, tmp_path, capsys):
    with open(tmp_path / "HPS_v2.1_compressed.pt", "wb") as sparse:  # 1.5 GiB as the checker sees it
        sparse.truncate(3 * 2**29)
    code = main(["--config", "configs/flux_dev.yaml", "--set", f"model.path={tiny_folder('flux')}",
                 "--set", f"reward.options.hpsv2.path={tmp_path}"])
    out = capsys.readouterr().out
    assert code == 1
    assert "warn  resources  bundles need 8 GPU, 64 CPU" in out
    assert "FAIL  plan       0 of " in out and "nothing would run in low precision" in out  # tiny < min dim 1000
    assert "plus the reward models' 1.50 GiB of weights on each explorer and the learner" in out


def test_the_qwen_image_preset_checks_against_the_tiny_folder_with_only_its_model_path_changed(tiny_folder, tmp_path,
                                                                                               capsys):
    """Every row passes or warns (no GPU here, 48 slots over 5 learners) but the layer plan, which fails because
    the tiny folder's Linears are narrower than the family's 3072 minimum; with that lowered it passes too."""
    with open(tmp_path / "HPS_v2.1_compressed.pt", "wb") as sparse:
        sparse.truncate(2**20)
    sets = ["--set", f"model.path={tiny_folder('qwen_image')}", "--set", f"reward.options.hpsv2.path={tmp_path}"]
    assert main(["--config", "configs/qwen_image.yaml", *sets]) == 1
    out, err = capsys.readouterr()
    assert "1 check(s) failed: plan" in err and "FAIL  plan       0 of 34 Linears in nvfp4" in out
    assert main(["--config", "configs/qwen_image.yaml", *sets, "--set", "explore.min_dim=0"]) == 0
    out = capsys.readouterr().out
    assert "ok    plan       24 of 34 Linears in nvfp4" in out and "ok    memory" in out and "FAIL" not in out


def test_a_bad_config_is_exit_2(capsys):
    assert main(["--set", "explore.precision=int3"]) == 2
    assert "explore.precision" in capsys.readouterr().err


def test_a_launch_checks_its_inputs_once_and_its_table_reuses_that_pass(tmp_path, monkeypatch, capsys):
    """The launcher's resolve runs `check_inputs` before it writes anything; the preflight table it prints
    next reports that pass instead of checking every input again: each prompt set is read once per launch."""
    from cluster import launch
    from cluster.config import preflight

    read, load = [], preflight.load_prompt_set
    monkeypatch.setattr(preflight, "load_prompt_set", lambda source, **kw: read.append(source) or load(source, **kw))
    monkeypatch.setattr(launch, "_run", lambda args, plan: 0)  # everything before Ray, not Ray
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert launch.main(["--config", "configs/embedded.yaml", "--run-dir", str(tmp_path / "run")]) == 0
    prompts = load_config("configs/embedded.yaml").prompts
    assert read == [prompts.source, prompts.eval_source]
    assert capsys.readouterr().out.count("ok    inputs") == 1


def test_memory_estimate_follows_its_formulas():
    config = load_config("configs/embedded.yaml")
    model = meta_transformer(EMBEDDED_MODEL)
    family = family_for_transformer(type(model).__name__)
    params = stored_parameters(EMBEDDED_MODEL)
    assert params["transformer"] == sum(t.numel() for t in model.state_dict().values())  # buffers too
    plain = estimate_memory(config, model, family, params)
    checkpointed = estimate_memory(load_config("configs/embedded.yaml", ["training.gradient_checkpointing=true"]),
                                   model, family, params)
    assert checkpointed["learner_activations"] < plain["learner_activations"] / 2
    # LoRA: 7 fp32 copies of r·(in + out) over the family's 8 attention projections of each of the 4 blocks
    lora = sum(32 * (64 + 64) for _ in range(4) for _ in range(8)) - 32 * (64 + 64)  # block 3 has no to_add_out
    assert plain["learner_training_state"] * 2**30 == pytest.approx(7 * 4 * lora)


def test_an_explorer_is_estimated_with_one_transformer_and_with_lora_the_adapted_weights_beside():
    """The engine is the policy's transformer; the lora codec adds a copy of the 31 adapted 64×64 weights (bf16,
    the dtype `auto` is estimated in); the other codecs nothing."""
    model = meta_transformer(EMBEDDED_MODEL)
    family, params = family_for_transformer(type(model).__name__), stored_parameters(EMBEDDED_MODEL)
    estimates = {codec: estimate_memory(load_config("configs/embedded.yaml", [f"cluster.codec={codec}"]), model,
                                        family, params) for codec in ("dense", "nvfp4", "lora")}
    base = 31 * 64 * 64 * 2
    assert estimates["dense"] == estimates["nvfp4"] and estimates["dense"]["explorer_lora_base"] == 0
    assert estimates["lora"]["explorer_lora_base"] * 2**30 == base
    assert (estimates["lora"]["explorer"] - estimates["dense"]["explorer"]) * 2**30 == pytest.approx(base)


@pytest.mark.parametrize("preset", sorted(p.name for p in __import__("pathlib").Path("configs").glob("*.yaml")))
def test_every_shipped_preset_prints_every_row_at_once(preset, capsys):
    """Whatever fails first (here: reward files and model folders that are not on this machine), each row is
    printed; the model's rows say what they would need when its folder is not there."""
    main(["--config", f"configs/{preset}"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines] == ["inputs", "resources", "learners", "backend", "plan", "memory",
                                                   "shm"], lines
    for line in lines[4:]:
        assert line.startswith(("ok  ", "FAIL", "warn")) or "not evaluated: " in line, line
    if "not evaluated" in lines[4]:
        assert "not evaluated: model.path: " in lines[4]


def test_the_memory_row_compares_each_actor_with_its_gpu_share():
    from cluster.check import memory_row

    config = load_config("configs/embedded.yaml", ["cluster.learner.num_gpus=1", "cluster.explorers.num_gpus=0.5"])
    model = meta_transformer(config.model.folder())
    family, params = family_for_transformer(type(model).__name__), stored_parameters(config.model.folder())
    m = estimate_memory(config, model, family, params)
    roomy = memory_row(config, model, family, params, gpu_gib=80.0, source="an 80 GiB GPU named by the test")
    assert roomy.ok and roomy.detail.endswith("fits a 80 GiB GPU (an 80 GiB GPU named by the test)")
    # a GPU between the two estimates: the explorer's half share is too small, the learner's whole one is not
    tight = memory_row(config, model, family, params, gpu_gib=1.5 * m["explorer"])
    assert (m["learner"] <= 1.5 * m["explorer"]) == ("each learner needs" not in tight.detail)
    assert tight.ok is False
    share = f"each explorer needs ≈ {m['explorer']:.1f} GiB of its {0.75 * m['explorer']:.1f} GiB GPU share"
    assert share in tight.detail
    assert "a smaller explore.batch_size" in tight.detail
    tiny = memory_row(config, model, family, params, gpu_gib=1e-6)
    assert tiny.ok is False and "training.gradient_checkpointing=true" in tiny.detail
    on_cpu = memory_row(load_config("configs/embedded.yaml"), model, family, params, gpu_gib=1e-6)
    assert on_cpu.ok and on_cpu.detail.endswith("not compared: no actor takes a GPU")
    assert memory_row(config, model, family, params).detail.endswith("not compared with a GPU's memory (no GPU here)")


def test_the_backend_row_says_what_the_explorers_gpu_will_run():
    from tiny import tiny_config

    from cluster.check import backend_row, with_engine
    from diffusion.quant import DeviceFacts

    hopper = DeviceFacts((9, 0), te=False, torchao=True)
    row, choice = backend_row(tiny_config(), hopper, "a GPU of the cluster: H200")
    assert row.ok is True
    assert row.detail == "auto → fp8 on torchao: real FP8 GEMMs on sm_90 (a GPU of the cluster: H200)"
    assert with_engine(tiny_config(), choice).explore.precision == "fp8"  # the plan and sync estimate follow it
    row, choice = backend_row(tiny_config("explore.precision=nvfp4"), hopper, "H200")
    assert row.ok is False and choice is None
    assert "nvfp4 emulated by the modelopt backend's fake quantization on sm_90" in row.detail
    assert "fp8 runs real FP8 GEMMs here" in row.detail and "explore.allow_emulation=true" in row.detail
    row, choice = backend_row(tiny_config("explore.precision=nvfp4", "explore.allow_emulation=true"), hopper, "H200")
    assert row.ok is None and choice.emulated  # a warning: it runs, slower than BF16


def test_the_learners_row_says_what_uneven_slots_cost():
    """48 slots over 5 learner ranks: a warning naming the idle rank-time and the fixes; the presets' 4 ranks
    divide them."""
    from cluster.check import learners_row

    row = learners_row(load_config("configs/sd35_large.yaml", ["cluster.learner.count=5",
                                                                "cluster.explorers.count=3"]))
    assert row.ok is None  # a warning: it runs, 4% of the learners' time waiting on the busiest rank
    assert row.detail == (
        "48 slots over 5 learner ranks: the busiest trains 10, the ideal 9.6; 4% of learner time idle each "
        "iteration; L = 4 or 6 divides 48 evenly (ranks 2–4 train 10, ranks 0–1 train 9: rank 0, which also "
        "publishes, is among the lighter); to balance, set cluster.learner.count to 4 or 6, or "
        "prompts.per_iteration to 45 or 50 (multiples of 5)")
    even = learners_row(load_config("configs/flux_dev.yaml"))
    assert (even.ok, even.detail) == (True, "48 slots over 4 learner ranks: 12 each, none idle")
    seven = learners_row(load_config("configs/sd35_large.yaml", ["cluster.learner.count=7",
                                                                   "cluster.explorers.count=1"]))
    assert seven.ok is None and "the busiest trains 7, the ideal 6.86; 2% of learner time idle" in seven.detail
    assert seven.detail.endswith("prompts.per_iteration to 42 or 49 (multiples of 7)")
