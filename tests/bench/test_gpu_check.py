"""`bench.gpu_check --device cpu --tiny`: the GPU check's own code, run here so it is known to work before a
GPU is lent. Every field the GPU run writes is written (memory: null without CUDA)."""

from __future__ import annotations

import ast
import json
from importlib.metadata import version
from pathlib import Path

import pytest
import torch

from bench.gpu_check import FULL, GPU_TEST_FILES, TINY, WHEELS, main
from bench.plan import load_costs

TESTS = Path(__file__).resolve().parents[1]

ROW_FIELDS = {
    "batch", "resolution", "device", "params_b", "fp8_over_bf16", "nvfp4_emulated_over_bf16", "paper_fp4_over_bf16",
    "fp8_copy_s", "fp8_refresh_s", "lora_step_s_per_sample", "learner_peak_gib", "lora_step_s_per_sample_checkpointed",
    "learner_peak_gib_checkpointed",
    *(f"{label}_{field}" for label in ("bf16", "fp8", "nvfp4_emulated")
      for field in ("s_per_sample_step", "explorer_peak_gib", "layers", "backend")),
}


def test_the_cpu_mode_writes_every_field_of_the_gpu_run(tmp_path) -> None:
    assert main(["--out", str(tmp_path), "--device", "cpu", "--tiny"]) == 0
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["mode"] == "tiny" and result["wheels"] == list(WHEELS) and "torchao==0.18.0" in WHEELS
    assert result["tests"]["exit_code"] == 0 and "skipped" in result["tests"]["summary"]  # gpu tests skip here
    assert set(result["step_price"]) == set(TINY) <= set(FULL)
    for name, row in result["step_price"].items():
        assert set(row) == ROW_FIELDS, name
        assert row["fp8_backend"] == "torchao" and row["nvfp4_emulated_backend"] == "project" and row["fp8_layers"]
        assert row["fp8_over_bf16"] == pytest.approx(row["fp8_s_per_sample_step"] / row["bf16_s_per_sample_step"])
        assert row["learner_peak_gib"] is None and row["lora_step_s_per_sample"] > 0
        costs = load_costs(tmp_path / f"costs_{name}.json")  # what bench.plan / bench.convergence --costs read
        assert costs.explore_s_per_sample_step == row["fp8_s_per_sample_step"]
        assert costs.regen_s_per_sample_step == row["bf16_s_per_sample_step"]
        assert set(result["memory_estimates"][name]) == {"explorer_gib", "learner_gib", "encoders_gib"}
    decode = result["decode_reward"]
    assert decode["vae_decode_s_per_image"] > 0
    for name in result["step_price"]:  # d: one image's decode and reward forward, in every costs file
        assert load_costs(tmp_path / f"costs_{name}.json").decode_reward_s_per_image == pytest.approx(
            decode["vae_decode_s_per_image"] + decode["reward_forward_s_per_image"])
    table = (tmp_path / "gpu_check.md").read_text()
    assert "| sd35_medium | 2 |" in table and "n/a (no CUDA)" in table


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_without_a_gpu_is_refused_with_the_cpu_mode_named(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--out", "unused"])
    assert "--device cpu --tiny" in capsys.readouterr().err


def test_every_gpu_marked_test_is_in_the_files_the_check_runs() -> None:
    """Every test file that names the `gpu` mark (`pytest.mark.gpu`, read from its syntax tree: a subprocess
    collecting the whole suite to ask pytest took half a minute) is one the GPU check runs."""
    marked = set()
    for path in sorted(TESTS.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "gpu" and ast.unparse(node.value) == "pytest.mark":
                marked.add(path.relative_to(TESTS.parent).as_posix())
    assert marked == set(GPU_TEST_FILES)


def test_the_wheels_to_carry_are_the_versions_installed_here() -> None:
    """Each wheel the GPU machine is given is the version this venv holds (the one the CPU suite passes in)."""
    wheels = dict(wheel.split("==", 1) for wheel in WHEELS)
    assert {name: version(name) for name in wheels} == wheels
