"""The learner group's data parallelism without Ray: two processes in a real gloo process group, each a
Trainer on its own slots, against one Trainer on every slot, for each objective."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp
from tiny import tiny_config

from learner.data_parallel import Shard, join, owner_of
from learner.trainer import Trainer

TOLERANCE = 1e-6  # fp32 rounding of a sum formed in another order (learner/data_parallel.py)
OBJECTIVES = {
    "nft": ["learner.algorithm=diffusionnft"],
    "art": ["learner.algorithm=diffusionnft", "learner.objective=art", "learner.decay.type=0"],
}


def _rank(rank: int, world: int, address: str, overrides: list[str], out: str) -> None:
    torch.set_num_threads(1)
    shard = Shard(rank, world)
    join(address, shard, timeout_s=120)
    trainer = Trainer(tiny_config(*overrides), shard=shard)
    history = []
    for iteration in range(2):
        result = trainer.train_iteration(iteration)
        trainer.finish_iteration()
        history.append(result.metrics())
    torch.save({"theta": {k: v.detach() for k, v in trainer.state.theta_parameters().items()},
                "old": {k: v.detach() for k, v in trainer.state.old_parameters().items()},
                "history": history}, f"{out}/rank{rank}.pt")


def _alone(overrides: list[str]) -> tuple[dict, list]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer = Trainer(tiny_config(*overrides))
        history = []
        for i in range(2):
            history.append(trainer.train_iteration(i).metrics())
            trainer.finish_iteration()
        return {k: v.detach() for k, v in trainer.state.theta_parameters().items()}, history
    finally:
        torch.set_num_threads(threads)


def test_slots_are_partitioned_by_rank():
    assert [owner_of(s, 3) for s in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert [s for s in range(5) if Shard(1, 2).owns(s)] == [1, 3]
    with pytest.raises(ValueError, match="rank 2 is not in a group of 2"):
        Shard(2, 2)


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_two_ranks_train_like_one_learner(objective, tmp_path):
    overrides = OBJECTIVES[objective]
    address = f"file://{tmp_path / 'rendezvous'}"
    mp.start_processes(_rank, args=(2, address, overrides, str(tmp_path)), nprocs=2, start_method="spawn")
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    # identical on every rank, bit for bit: the step, the soft update (what rank 0 publishes)
    for view in ("theta", "old"):
        assert all(torch.equal(ranks[0][view][k], ranks[1][view][k]) for k in ranks[0][view])
    theta, history = _alone(overrides)
    worst = max(float((ranks[0]["theta"][k] - theta[k]).abs().max()) for k in theta)
    assert worst <= TOLERANCE, worst
    moved = max(float(theta[k].abs().max()) for k in theta if ".lora_B." in k)
    assert moved > 100 * TOLERANCE  # the comparison is not of two untouched adapters
    group = [{**m, "fp_sample_steps": m["fp_sample_steps"] + other["fp_sample_steps"]}  # the group's work: the sum
             for m, other in zip(ranks[0]["history"], ranks[1]["history"], strict=True)]
    # the whole batch's numbers, gathered from both ranks: exact while both hold the same policy (iteration
    # 0), within rounding after it
    for key in ("reward_mean", "reward_max", "fp_sample_steps"):
        assert group[0][key] == history[0][key]
        assert [m[key] for m in group] == pytest.approx([m[key] for m in history], rel=1e-5)
    assert [m["loss"] for m in group] == pytest.approx([m["loss"] for m in history], rel=1e-4)
