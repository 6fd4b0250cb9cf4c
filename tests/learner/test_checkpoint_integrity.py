"""Checkpoints are verified before they are trusted; non-finite weights are never written or published;
equal weights give equal files (safetensors and sample grids). Real tiny model, real files, no mocks."""

from __future__ import annotations

import copy
import errno
import hashlib
import json
import math
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from cluster.reports.figures import save_image_grid, save_reward_curve
from diffusion.config import EMBEDDED_MODEL
from diffusion.loading import load_policy
from diffusion.noise import grid_seeds
from learner.checkpoint import (
    CheckpointWriteFailed,
    CorruptCheckpoint,
    NonFiniteWeights,
    previous_checkpoint,
    safetensors_metadata,
    save_checkpoint,
    write_safetensors,
)
from learner.checkpoint_load import load_checkpoint, verify_checkpoint
from learner.config import TrainingConfig
from learner.rollouts import generate
from learner.training_state import TrainingState

MISMATCH = "checksum mismatch (the file changed after it was written)"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def base():
    return load_policy(EMBEDDED_MODEL)


def make_state(base, seed: int = 0) -> TrainingState:
    config = TrainingConfig(lora_rank=4, lora_alpha=8)
    return TrainingState(copy.deepcopy(base.transformer), config, family_targets=base.family.lora_targets, seed=seed)


def train_step(state: TrainingState, base) -> None:
    """One AdamW step and a soft update, so that θ, θ_old and the optimizer state all hold values."""
    g = torch.Generator().manual_seed(len(state.optimizer.state))
    x = torch.randn(2, *base.latent_shape, generator=g)
    sigma = torch.rand(2, generator=g)
    cond = base.encode(["a red square", "a blue circle"])
    with state.use("theta") as model:
        loss = base.velocity(x, sigma, cond, transformer=model).square().mean()
    state.step(loss)
    state.update_ema(1)
    state.soft_update(0.5)


def snapshot(state: TrainingState) -> dict[str, torch.Tensor]:
    """θ, θ_old and the optimizer tensors, cloned, by a flat name."""
    out = {f"theta/{k}": v.detach().clone() for k, v in state.theta_parameters().items()}
    out |= {f"old/{k}": v.detach().clone() for k, v in state.old_parameters().items()}
    names = {id(p): k for k, p in state.theta_parameters().items()}
    for param, values in state.optimizer.state.items():
        out |= {f"opt/{key}/{names[id(param)]}": torch.as_tensor(v).clone() for key, v in values.items()}
    return out


def assert_bitwise(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


def data_span(path: Path, name: str) -> tuple[int, int]:
    """Absolute [start, end) byte range of tensor `name` in a safetensors file."""
    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    begin, end = json.loads(raw[8 : 8 + size])[name]["data_offsets"]
    return 8 + size + begin, 8 + size + end


def first_lora_a(path: Path) -> str:
    return sorted(k for k in load_file(str(path)) if ".lora_A." in k)[0]


@pytest.fixture(scope="module")
def saved(base, tmp_path_factory) -> dict:
    """One checkpoint of a trained state; tests copy the folder before damaging it."""
    torch.manual_seed(3)
    state = make_state(base)
    train_step(state, base)
    folder = save_checkpoint(tmp_path_factory.mktemp("ckpt") / "checkpoint", state, iteration=1,
                             extra={"version": 1})
    return {"folder": folder, "state": state}


def copy_checkpoint(saved: dict, tmp_path: Path) -> Path:
    target = tmp_path / "run" / "checkpoint"
    shutil.copytree(saved["folder"], target)
    return target


# ---- verification ----------------------------------------------------------------------------------
def test_meta_records_checksums_and_the_checkpoint_verifies(saved):
    folder = saved["folder"]
    meta = verify_checkpoint(folder)
    assert meta["version"] == 2 and meta["iteration"] == 1
    assert sorted(meta["files"]) == sorted(["theta.safetensors", "old.safetensors", "optimizer.safetensors",
                                            "rng.safetensors", "ema.safetensors"])
    for name, entry in meta["files"].items():
        data = (folder / name).read_bytes()
        assert entry == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    assert safetensors_metadata(folder / "theta.safetensors") == {"format": "sol-rl-training-state"}


def test_the_ema_of_theta_round_trips_and_an_old_checkpoint_restarts_it_from_theta(base, saved, tmp_path):
    restored = make_state(base, seed=1)
    load_checkpoint(saved["folder"], restored)
    original = saved["state"].ema.average
    assert all(torch.equal(restored.ema.average[k], original[k]) for k in original)
    theta = restored.theta_parameters()
    assert any(not torch.equal(original[k], theta[k]) for k in original), "the EMA must differ from θ here"
    # a checkpoint written without an EMA (training.ema=false) restarts the EMA from θ, with a warning
    plain = TrainingState(copy.deepcopy(base.transformer), TrainingConfig(lora_rank=4, lora_alpha=8, ema=False),
                          family_targets=base.family.lora_targets)
    load_checkpoint(saved["folder"], plain)
    save_checkpoint(tmp_path / "no_ema", plain, iteration=1)
    assert not (tmp_path / "no_ema" / "ema.safetensors").exists()
    with pytest.warns(UserWarning, match="no EMA of θ in this checkpoint"):
        load_checkpoint(tmp_path / "no_ema", restored)
    assert all(torch.equal(restored.ema.average[k], theta[k]) for k in theta)


def test_nan_bytes_in_theta_are_refused(base, saved, tmp_path):
    folder = copy_checkpoint(saved, tmp_path)
    theta_file = folder / "theta.safetensors"
    name = first_lora_a(theta_file)
    start, end = data_span(theta_file, name)
    assert end - start >= 16 * 4
    raw = bytearray(theta_file.read_bytes())
    size = len(raw)
    raw[start : start + 16 * 4] = struct.pack("<16f", *[math.nan] * 16)
    theta_file.write_bytes(bytes(raw))
    assert theta_file.stat().st_size == size

    expected = f"{theta_file}: {MISMATCH}; 16 non-finite values in '{name}'"
    with pytest.raises(CorruptCheckpoint) as info:
        verify_checkpoint(folder)
    assert str(info.value) == expected
    fresh = make_state(base, seed=9)
    before = snapshot(fresh)
    with pytest.raises(CorruptCheckpoint) as info:
        load_checkpoint(folder, fresh)
    assert str(info.value) == expected
    assert_bitwise(snapshot(fresh), before)  # nothing was applied


def test_a_flipped_exponent_bit_is_a_checksum_mismatch(saved, tmp_path):
    folder = copy_checkpoint(saved, tmp_path)
    old_file = folder / "old.safetensors"
    start, _ = data_span(old_file, first_lora_a(old_file))
    raw = bytearray(old_file.read_bytes())
    (value,) = struct.unpack("<f", raw[start : start + 4])
    raw[start + 2] ^= 0x80  # bit 23 of the little-endian float32: the exponent's lowest bit
    (flipped,) = struct.unpack("<f", raw[start : start + 4])
    assert math.isfinite(flipped) and abs(flipped) in (abs(value) * 2, abs(value) / 2)
    old_file.write_bytes(bytes(raw))
    with pytest.raises(CorruptCheckpoint) as info:
        verify_checkpoint(folder)
    assert str(info.value) == f"{old_file}: {MISMATCH}"


def test_missing_file_unreadable_meta_and_version_1_are_refused(saved, tmp_path):
    folder = copy_checkpoint(saved, tmp_path)
    (folder / "rng.safetensors").unlink()
    with pytest.raises(CorruptCheckpoint) as info:
        verify_checkpoint(folder)
    assert str(info.value) == f"{folder / 'rng.safetensors'}: missing"

    meta_path = folder / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps(meta)[:-20])
    with pytest.raises(CorruptCheckpoint, match=rf"^{meta_path}: unreadable \(") as info:
        verify_checkpoint(folder)
    assert "\n" not in str(info.value)

    meta["version"] = 1
    del meta["files"]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(CorruptCheckpoint) as info:
        verify_checkpoint(folder)
    assert str(info.value) == (f"{meta_path}: a version 1 checkpoint has no checksums, so it cannot be verified "
                               "and is not loaded (this code reads version 2)")


def test_two_saves_keep_the_previous_one_and_offer_it(base, tmp_path):
    torch.manual_seed(4)
    state = make_state(base)
    target = tmp_path / "checkpoint"
    train_step(state, base)
    save_checkpoint(target, state, iteration=1, extra={"version": 1})
    first = snapshot(state)
    first_rng = torch.get_rng_state()
    train_step(state, base)
    save_checkpoint(target, state, iteration=2, extra={"version": 2})
    previous = previous_checkpoint(target)
    assert previous == tmp_path / "checkpoint.previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "checkpoint.previous"]
    assert verify_checkpoint(previous)["iteration"] == 1 and verify_checkpoint(target)["iteration"] == 2

    theta_file = target / "theta.safetensors"
    raw = bytearray(theta_file.read_bytes())
    raw[-1] ^= 0x01
    theta_file.write_bytes(bytes(raw))
    expected = f"{theta_file}: {MISMATCH}; the previous checkpoint {previous} (iteration 1) verifies"
    fresh = make_state(base, seed=7)
    with pytest.raises(CorruptCheckpoint) as info:
        load_checkpoint(target, fresh)
    assert str(info.value) == expected

    # the offered one restores iteration 1 bitwise: parameters, optimizer state, RNG
    torch.manual_seed(123)
    assert load_checkpoint(previous, fresh) == {"iteration": 1, "extra": {"version": 1}}
    assert_bitwise(snapshot(fresh), first)
    assert torch.equal(torch.get_rng_state(), first_rng)

    # a third save rotates again: the damaged one is now the previous one and says so
    save_checkpoint(target, fresh, iteration=3, extra={})
    assert verify_checkpoint(target)["iteration"] == 3
    with pytest.raises(CorruptCheckpoint, match=rf"^{previous / 'theta.safetensors'}: checksum mismatch"):
        verify_checkpoint(previous)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "checkpoint.previous"]


def test_save_refuses_non_finite_state(base, tmp_path):
    state = make_state(base)
    train_step(state, base)
    target = tmp_path / "checkpoint"
    save_checkpoint(target, state, iteration=1, extra={})
    good = (target / "meta.json").read_bytes()
    name = sorted(k for k in state.theta_parameters() if ".lora_B." in k)[0]
    with torch.no_grad():
        state.theta_parameters()[name][0, 0] = math.inf
    with pytest.raises(NonFiniteWeights) as info:
        save_checkpoint(target, state, iteration=2, extra={})
    assert str(info.value) == f"save_checkpoint: refusing to write non-finite theta to {target}: 1 non-finite value " \
                              f"in '{name}'"
    with torch.no_grad():
        state.theta_parameters()[name][0, 0] = 0.0
        param = state.theta_parameters()[name]
        state.optimizer.state[param]["exp_avg_sq"][0, :3] = math.nan
    with pytest.raises(NonFiniteWeights, match=rf"non-finite optimizer state to .*: 3 non-finite values in "
                                               rf"'exp_avg_sq/{name}'$"):
        save_checkpoint(target, state, iteration=2, extra={})
    # nothing was written or rotated: the good checkpoint is still the only one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]
    assert (target / "meta.json").read_bytes() == good
    verify_checkpoint(target)


def test_a_save_that_died_between_its_renames_loads_and_is_finished(base, tmp_path):
    state = make_state(base)
    target = tmp_path / "ckpt"
    save_checkpoint(target, state, iteration=1, extra={})
    save_checkpoint(target, state, iteration=2, extra={})
    # The third save died after moving ckpt (2) to ckpt.previous and discarding the older ckpt.previous (1),
    # before moving its complete ckpt.tmp (3) into place.
    save_checkpoint(tmp_path / "third", state, iteration=3, extra={})
    previous = previous_checkpoint(target)
    shutil.rmtree(previous)
    target.rename(previous)
    (tmp_path / "third").rename(tmp_path / "ckpt.tmp")
    with pytest.warns(UserWarning, match="interrupted"):
        assert load_checkpoint(target, state)["iteration"] == 3
    save_checkpoint(target, state, iteration=4, extra={})  # finishes the third save first: it becomes .previous
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "ckpt.previous"]
    assert verify_checkpoint(target)["iteration"] == 4 and verify_checkpoint(previous)["iteration"] == 3


# ---- a disk that refuses the write ---------------------------------------------------------------------
FULL_DISK_CHILD = """
import json, pickle, resource, signal, sys
from pathlib import Path
sys.path.insert(0, "tests")
from tiny import tiny_config
from learner.checkpoint import CheckpointWriteFailed, save_checkpoint
from learner.trainer import Trainer

out = Path(sys.argv[1])
trainer = Trainer(tiny_config("eval.prompts=1"), run_dir=None)
trainer.iteration, trainer.version = 1, 1
target = save_checkpoint(out / "checkpoint", trainer.state, iteration=1)
trainer.save_final(out / "final")
# From here on no file may grow past a limit, as on a full disk: write() fails with EFBIG (SIGXFSZ ignored).
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
limits = {"checkpoint": (target / "theta.safetensors").stat().st_size // 2,  # cut in the middle of θ
          "final": (out / "final" / "transformer" / "diffusion_pytorch_model.safetensors").stat().st_size // 2}
results = {}
for what, limit in limits.items():
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    trainer.iteration, trainer.version = 2, 2
    try:
        save_checkpoint(target, trainer.state, iteration=2) if what == "checkpoint" else trainer.save_final(out / what)
    except CheckpointWriteFailed as exc:
        copy = pickle.loads(pickle.dumps(exc))  # as Ray hands it from the learner actor to the driver
        results[what] = {"message": str(exc), "errno": exc.errno, "folder": str(exc.folder),
                         "pickled": [str(copy), copy.errno, str(copy.folder)]}
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def full_disk(tmp_path_factory) -> dict:
    """A checkpoint and a final/ written, then each written again while no file may grow past a limit (the
    real write fails, EFBIG): what the process raised, and the folder it left."""
    out = tmp_path_factory.mktemp("full_disk")
    child = subprocess.run([sys.executable, "-c", FULL_DISK_CHILD, str(out)], cwd=REPO, capture_output=True,
                           text=True, timeout=300)
    assert child.returncode == 0, child.stderr
    return {"out": out, "raised": json.loads(child.stdout.strip().splitlines()[-1])}


def test_a_checkpoint_the_disk_refuses_leaves_the_previous_one_in_use(full_disk, base):
    """Before: a traceback (SafetensorError ... File too large / No space left on device) and a partial
    checkpoint.tmp/ left behind."""
    out, raised = full_disk["out"], full_disk["raised"]["checkpoint"]
    target = out / "checkpoint"
    assert raised["message"] == (
        f"could not write the checkpoint {target}: File too large ({target}.tmp/theta.safetensors); removed "
        f"{target}.tmp, the previous checkpoint {target} (iteration 1) is intact")
    assert raised["errno"] == errno.EFBIG and raised["folder"] == str(target)
    assert raised["pickled"] == [raised["message"], errno.EFBIG, str(target)]
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint", "final"]  # no .tmp, nothing rotated
    assert verify_checkpoint(target)["iteration"] == 1
    tiny = TrainingState(copy.deepcopy(base.transformer), TrainingConfig(lora_rank=4, lora_alpha=8),
                         family_targets=base.family.lora_targets)
    assert load_checkpoint(target, tiny)["iteration"] == 1


def test_a_final_folder_the_disk_refuses_leaves_the_earlier_one(full_disk):
    """Before: a traceback and a half-written final/ in place of the earlier one."""
    out, raised = full_disk["out"], full_disk["raised"]["final"]
    final = out / "final"
    assert raised["message"] == (f"could not write the final weights {final}: File too large ({final}.tmp); "
                                 f"removed {final}.tmp, the earlier {final} is intact")
    assert raised["errno"] == errno.EFBIG and raised["folder"] == str(final)
    assert json.loads((final / "run.json").read_text())["iteration"] == 1  # the first save's, whole
    assert safetensors_metadata(final / "sampling_transformer.safetensors") == {"iteration": 1, "policy_version": 1}
    assert load_file(str(final / "transformer" / "diffusion_pytorch_model.safetensors"))


def test_a_checkpoint_write_failure_is_an_os_error_naming_its_folder():
    error = CheckpointWriteFailed("could not write the checkpoint x: No space left on device", Path("x"),
                                  errno.ENOSPC)
    assert isinstance(error, OSError) and str(error) == "could not write the checkpoint x: No space left on device"
    assert (error.errno, error.folder) == (errno.ENOSPC, Path("x"))


# ---- deterministic safetensors ---------------------------------------------------------------------
WRITE_IN_CHILD = """
import sys
from safetensors.torch import load_file
from learner.checkpoint import write_safetensors
write_safetensors(sys.argv[2], load_file(sys.argv[1]), {"iteration": 3, "policy_version": 2})
"""


def test_equal_tensors_give_equal_files_across_calls_and_processes(saved, tmp_path):
    tensors = load_file(str(saved["folder"] / "theta.safetensors"))
    tensors["z_bf16"] = torch.arange(6, dtype=torch.bfloat16)
    source = tmp_path / "source.safetensors"
    write_safetensors(source, tensors)
    metadata = {"iteration": 3, "policy_version": 2}
    digests = {write_safetensors(tmp_path / f"{i}.safetensors", tensors, metadata) for i in range(20)}
    assert len(digests) == 1
    reference = (tmp_path / "0.safetensors").read_bytes()
    assert all((tmp_path / f"{i}.safetensors").read_bytes() == reference for i in range(20))
    for child in ("a", "b"):
        subprocess.run([sys.executable, "-c", WRITE_IN_CHILD, str(source), str(tmp_path / f"{child}.safetensors")],
                       check=True, cwd=REPO)
        assert (tmp_path / f"{child}.safetensors").read_bytes() == reference
    assert safetensors_metadata(tmp_path / "a.safetensors") == metadata


# ---- the trainer: publish, final weights, sample grids ---------------------------------------------



def test_final_weights_are_deterministic_files(tmp_path, small_trainer):
    trainer = small_trainer("eval.prompts=1")
    trainer.iteration, trainer.version = 3, 2
    for i in range(12):
        trainer.save_final(tmp_path / f"final{i}")
    for name in ("transformer/diffusion_pytorch_model.safetensors", "sampling_transformer.safetensors"):
        reference = (tmp_path / "final0" / name).read_bytes()
        assert all((tmp_path / f"final{i}" / name).read_bytes() == reference for i in range(12)), name
    assert json.loads((tmp_path / "final0" / "run.json").read_text())["policy_version"] == 2
    name = "sampling_transformer.safetensors"
    assert safetensors_metadata(tmp_path / "final0" / name) == {"iteration": 3, "policy_version": 2}
    subprocess.run([sys.executable, "-c", WRITE_IN_CHILD, str(tmp_path / "final0" / name),
                    str(tmp_path / f"child_{name}")], check=True, cwd=REPO)
    assert (tmp_path / f"child_{name}").read_bytes() == reference


def test_publish_and_save_final_refuse_non_finite_weights(tmp_path, small_trainer):
    trainer = small_trainer("eval.prompts=1", "training.ema=false")  # θ itself is what final/ holds
    theta = trainer.state.theta_parameters()
    name = sorted(k for k in theta if ".lora_B." in k)[0]
    layer = name.split(".lora_B.")[0]
    in_features = trainer.state.transformer.get_submodule(layer).in_features
    with torch.no_grad():
        theta[name][0, 0] = math.nan  # B[0, 0]: row 0 of B·A, all of the merged weight's row 0

    with pytest.raises(NonFiniteWeights) as info:
        trainer.save_final(tmp_path / "final")
    assert str(info.value) == (f"save_final: refusing to write non-finite weights to "
                               f"{tmp_path / 'final' / 'transformer'}: "
                               f"{in_features} non-finite values in '{layer}.weight'")
    assert not (tmp_path / "final").exists()

    trainer.publish()  # θ_old is still finite: publishing it is fine
    engine_before = {k: v.clone() for k, v in trainer.engine.module.state_dict().items()}
    trainer.state.soft_update(0.0)  # θ_old ← θ: now the sampling policy is broken too
    trainer.version = 1  # as after an update: the engine is behind and must be published to
    with pytest.raises(NonFiniteWeights) as info:
        trainer.publish()
    assert str(info.value) == ("publish: refusing to publish a non-finite sampling policy (version 1): "
                               f"{in_features} non-finite values in '{layer}.weight'")
    after = trainer.engine.module.state_dict()
    assert all(torch.equal(engine_before[k], after[k]) for k in engine_before), "the engine got NaN weights"


def test_sample_grid_ignores_the_prompt_cache_and_thread_count(small_trainer):
    """Before: a held-out prompt encoded first as a batch of one (evaluate) and later with the others
    (sample_images) gave conditionings that differ in the last bit, and so different grids. A prompt is
    now encoded alone on one thread wherever it comes from."""
    plain, evaluated = small_trainer(), small_trainer()
    evaluated.evaluate()  # fills the prompt cache one prompt at a time, as the base evaluation does
    torch.set_num_threads(2)
    rng = torch.get_rng_state()
    images = plain.sample_images(3)
    assert torch.get_num_threads() == 2 and torch.equal(torch.get_rng_state(), rng)
    assert torch.equal(images, evaluated.sample_images(3))
    torch.set_num_threads(1)  # the next test gets its count back (tests/conftest.py)
    assert torch.equal(images, plain.sample_images(3))
    # the merged plain transformer samples θ: the LoRA-adapted one agrees up to rounding
    prompts = [p for p in plain.eval_prompts for _ in range(3)]
    seeds = [s for slot in range(len(plain.eval_prompts)) for s in grid_seeds(plain.seed, slot, 3)]
    with plain.state.evaluated() as model:
        adapted = generate(plain.policy, model, None, prompts, seeds, plain.eval_sampling, return_images=True).images
    assert torch.allclose(adapted, images, atol=1e-5, rtol=0)


def test_resumed_run_draws_the_same_grid_bytes(tmp_path, small_trainer):
    """2 iterations straight (after a base evaluation, as a fresh `cluster.launch` run does) vs 1 iteration,
    a checkpoint, a fresh trainer restored from it and 1 more: equal weights, equal PNG bytes. With run
    seed 2 the old sampling path differed in 2 pixels of the grid."""
    overrides = ("run.seed=2", "eval.prompts=10")
    straight = small_trainer(*overrides, run_dir=tmp_path / "a")
    straight.evaluate()
    straight.run(2, log=lambda _: None)

    first = small_trainer(*overrides, run_dir=tmp_path / "b")
    first.run(1, log=lambda _: None)
    resumed = small_trainer(*overrides, run_dir=tmp_path / "b")
    info = load_checkpoint(tmp_path / "b" / "checkpoint", resumed.state)  # what Trainer.resume does
    resumed.iteration, resumed.version = info["iteration"], info["extra"]["version"]
    resumed.publish()
    resumed.run(2, log=lambda _: None)

    a, b = straight.state.theta_parameters(), resumed.state.theta_parameters()
    assert all(torch.equal(a[k], b[k]) for k in a)
    grids = [save_image_grid(t.sample_images(6), rows=10, path=tmp_path / f"{n}.png").read_bytes()
             for n, t in (("straight", straight), ("resumed", resumed))]
    assert grids[0] == grids[1]
    for n, t in (("straight", straight), ("resumed", resumed)):
        t.save_final(tmp_path / n / "final")
    for name in ("transformer/diffusion_pytorch_model.safetensors", "sampling_transformer.safetensors"):
        assert (tmp_path / "straight" / "final" / name).read_bytes() == (tmp_path / "resumed" / "final" / name
                                                                         ).read_bytes()
    # the reward curve of the whole run, from the resumed run's log, is the straight run's picture
    logged = [json.loads(line) for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    curves = [save_reward_curve(h, tmp_path / f"{n}_curve.png").read_bytes()
              for n, h in (("straight", straight.history), ("resumed", logged))]
    assert curves[0] == curves[1]
