"""Experiment logging: a real single-process run writes TensorBoard event files and an offline W&B run,
read back here with TensorBoard's own reader and W&B's record format; a missing package is refused
before anything starts, naming the extra to install."""

from __future__ import annotations

import json
import struct
import sys

import pytest
import torch
from tiny import tiny_config

from cluster.config.loading import ConfigError
from cluster.config.preflight import check_inputs
from learner.experiment_log import GridSamples, scalar_name, scalars
from learner.trainer import Trainer

ITERATIONS = 2


def wandb_history(run_file) -> list[dict]:
    """The history rows of an offline .wandb file: LevelDB-log framing (32 KiB blocks; records of
    crc32 u32, length u16, type u8 — full 1, first 2, middle 3, last 4) around W&B's protobuf records."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, rows, pos, part, block = run_file.read_bytes(), [], 7, b"", 32768  # 7: the ":W&B" header
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        if kind == 0:  # zero padding to the block's end
            pos += left - 7
            continue
        part += data[pos:pos + length]
        pos += length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(part)
            part = b""
            if record.WhichOneof("record_type") == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in record.history.item})
    return rows


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("logged")
    config = tiny_config(f"run.iterations={ITERATIONS}", "eval.every=1", "logging.tensorboard=true",
                         "logging.wandb={project: solrl-tests, mode: offline}", "logging.grid_prompts=2",
                         "logging.grid_seeds=3")
    trainer = Trainer(config, run_dir)
    trainer.evaluate_base()
    history = trainer.run()
    return run_dir, trainer, history


def test_tensorboard_holds_each_iterations_scalars_and_each_evaluations_grid(logged_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, trainer, history = logged_run
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"images": 0, "tensors": 0}).Reload()
    rewards = {e.step: e.value for e in events.Scalars("train/reward_mean")}
    assert rewards == pytest.approx({m["iteration"] + 1: m["reward_mean"] for m in history})
    held_out = {e.step: e.value for e in events.Scalars("eval/reward")}
    assert held_out == pytest.approx({0: trainer.base_eval["eval_reward"],
                                      **{m["iteration"] + 1: m["eval_reward"] for m in history}})
    assert {e.step for e in events.Scalars("seconds/train")} == {1, 2}
    images = events.Images("eval/samples")
    assert [i.step for i in images] == [0, 1, 2]
    # 2 prompts × 3 seeds, each tile enlarged to at least 96 px with a reward line under it
    assert images[-1].width == 3 * 96 and images[-1].height == 2 * (96 + 14)
    assert "eval/sample_rewards/text_summary" in events.Tags()["tensors"]


def test_the_offline_wandb_run_logs_the_same_scalars_and_captions_each_sample_with_its_reward(logged_run):
    run_dir, trainer, history = logged_run
    (run_file,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    rows = wandb_history(run_file)
    by_step: dict[int, dict] = {}
    for row in rows:
        by_step.setdefault(row["_step"], {}).update(row)
    assert sorted(by_step) == [0, 1, 2]
    for m in history:
        assert by_step[m["iteration"] + 1]["train/reward_mean"] == pytest.approx(m["reward_mean"])
        assert by_step[m["iteration"] + 1]["eval/reward"] == pytest.approx(m["eval_reward"])
    # the last grid, logged at step 2, is the final weights' grid: recomputed here, caption for caption
    grid = trainer.logged_grid()
    assert by_step[2]["eval/sample_list/captions"] == grid.captions()  # (nested keys read back as a/b/c)
    assert all(" · reward " in c for c in grid.captions()) and len(grid.captions()) == 6
    assert by_step[2]["eval/samples/_type"] == "image-file"
    assert (run_file.parent / "files" / by_step[2]["eval/samples/path"]).is_file()


def test_a_sink_whose_package_is_missing_is_refused_before_anything_starts(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # what an environment without it imports
    config = tiny_config("logging.wandb={project: p}")
    with pytest.raises(ConfigError, match=r"logging.wandb needs the wandb package, which is not installed: "
                                          r"pip install -e '\.\[wandb\]'"):
        check_inputs(config)
    assert check_inputs(tiny_config("logging.tensorboard=true")).notes == []  # installed: accepted


def test_logged_names_and_values():
    assert [scalar_name(k) for k in ("eval_reward", "train_s", "reward_mean", "eval_accuracy")] == \
        ["eval/reward", "seconds/train", "train/reward_mean", "eval/accuracy"]
    assert scalars({"iteration": 3, "reward_mean": 1.5, "skipped": True, "rank_spearman": float("nan"),
                    "streamed_slots": [1, 2], "train_s": 2}) == {"train/reward_mean": 1.5, "seconds/train": 2.0}
    grid = GridSamples(["a", "a", "b", "b"], torch.rand(4, 1, 8, 8), torch.tensor([0.5, 1.0, -2.0, 3.25]), 2)
    assert grid.captions() == ["a · reward 0.500", "a · reward 1.000", "b · reward -2.000", "b · reward 3.250"]
    picture = grid.labelled()
    assert picture.shape == (2 * (96 + 14), 2 * 96, 3) and picture.dtype.name == "uint8"
