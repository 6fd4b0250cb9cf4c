"""The learner group's data parallelism without Ray: two processes in a real gloo process group, each a
Trainer on its own slots, against one Trainer on every slot, for each objective."""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest
import torch
import torch.multiprocessing as mp
from tiny import tiny_config

from learner.data_parallel import LearnerGroupUnreachable, Shard, join, owner_of, slot_balance
from learner.trainer import Trainer
from learner.updates import micro_batches

TOLERANCE = 1e-6  # fp32 rounding of a sum formed in another order (learner/data_parallel.py)
OBJECTIVES = {
    "nft": ["learner.algorithm=diffusionnft"],
    "art": ["learner.algorithm=diffusionnft", "learner.objective=art", "learner.decay.type=0"],
    "flow_grpo": ["learner.algorithm=diffusionnft", "learner.objective=flow_grpo", "learner.decay.type=0"],
}
# A NaN in slot 1's first sample (row 4 of 8) with micro-batches of 3: the whole batch's micro-batch [3, 6)
# holds it, which spans both ranks (rank 0 owns slot 0: rows 0–3, rank 1 slot 1: rows 4–7).
NAN_ROW, NAN_SETS = 4, ["learner.algorithm=diffusionnft", "learner.micro_batch=3"]


def _nan_update(trainer: Trainer, slots: list[int]) -> dict:
    """One NFT update on `slots` (a rank's, or all) with sample NAN_ROW's x0 set to NaN; θ and the metrics."""
    prompts = trainer.prompts_for(0)
    groups = [trainer.rollout(0, slot, prompts[slot]) for slot in slots]
    keep = trainer.config.prompts.keep
    for slot, group in zip(slots, groups, strict=True):
        if slot == NAN_ROW // keep:
            group.samples.x0 = group.samples.x0.clone()
            group.samples.x0[NAN_ROW % keep] = float("nan")
    batch = trainer._whole_batch(slots, groups)
    advantages = trainer.updater.objective.advantages(trainer.updater.rewards_for_update(0, batch),
                                                      trainer.config.learner)
    metrics, _ = trainer.updater.update(0, groups, advantages[slots], slots, advantages)
    return {"theta": {k: v.detach() for k, v in trainer.state.theta_parameters().items()}, "metrics": metrics}


def _objective_run(trainer: Trainer) -> dict:
    """Two iterations of `trainer`: θ, θ_old and each iteration's metrics."""
    history = []
    for iteration in range(2):
        result = trainer.train_iteration(iteration)
        trainer.finish_iteration()
        history.append(result.metrics())
    return {"theta": {k: v.detach() for k, v in trainer.state.theta_parameters().items()},
            "old": {k: v.detach() for k, v in trainer.state.old_parameters().items()},
            "history": history}


def _rank(rank: int, world: int, address: str, out: str) -> None:
    """One rank of the group, for every objective and then the NaN update, one after the other in the same
    process group (one spawn for all: a rank's start-up, torch and the model, is most of its time)."""
    torch.set_num_threads(1)
    shard = Shard(rank, world)
    join(address, shard, timeout_s=120)
    for name, overrides in OBJECTIVES.items():
        torch.save(_objective_run(Trainer(tiny_config(*overrides), shard=shard)), f"{out}/{name}_rank{rank}.pt")
    trainer = Trainer(tiny_config(*NAN_SETS), shard=shard)
    slots = [s for s in range(2) if shard.owns(s, 2)]
    torch.save(_nan_update(trainer, slots), f"{out}/nan_rank{rank}.pt")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Callable[[str], list[dict]]:
    """`two_ranks(name)`: what ranks 0 and 1 of a real gloo group of two processes saved for that run."""
    out = tmp_path_factory.mktemp("two_ranks")
    address = f"tcp://127.0.0.1:{_free_port()}"
    mp.start_processes(_rank, args=(2, address, str(out)), nprocs=2, start_method="spawn")
    return lambda name: [torch.load(out / f"{name}_rank{r}.pt") for r in range(2)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alone(overrides: list[str]) -> tuple[dict, list]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run = _objective_run(Trainer(tiny_config(*overrides)))
        return run["theta"], run["history"]
    finally:
        torch.set_num_threads(threads)


def slots_per_rank(slots: int, world: int) -> list[int]:
    counts = [0] * world
    for slot in range(slots):
        counts[owner_of(slot, slots, world)] += 1
    return counts


def test_slots_are_partitioned_by_rank():
    assert [owner_of(s, 6, 3) for s in range(6)] == [0, 1, 2, 0, 1, 2]
    # 7 over 3: the short last round (slot 6) goes to the last rank, not to rank 0
    assert [owner_of(s, 7, 3) for s in range(7)] == [0, 1, 2, 0, 1, 2, 2]
    assert [s for s in range(5) if Shard(1, 2).owns(s, 5)] == [1, 3, 4]
    assert [s for s in range(5) if Shard(0, 2).owns(s, 5)] == [0, 2]
    with pytest.raises(ValueError, match="rank 2 is not in a group of 2"):
        Shard(2, 2)
    with pytest.raises(ValueError, match="slot 48 is not one of the iteration's 48 slots"):
        owner_of(48, 48, 5)


def test_48_slots_over_5_ranks_leave_rank_0_a_light_share():
    owners = [owner_of(s, 48, 5) for s in range(48)]
    assert owners[:45] == [s % 5 for s in range(45)]  # nine full rounds, as s mod L
    assert owners[45:] == [2, 3, 4]  # the short round on the last ranks
    assert slots_per_rank(48, 5) == [9, 9, 10, 10, 10]
    assert slots_per_rank(10, 4) == [2, 2, 3, 3]
    assert slots_per_rank(48, 7) == [6, 7, 7, 7, 7, 7, 7]
    assert slots_per_rank(3, 5) == [0, 0, 1, 1, 1]  # more ranks than slots (the config refuses it)


def test_the_partition_is_balanced_and_total_for_every_shape():
    for world in range(1, 13):
        for slots in range(1, 61):
            owners = [owner_of(s, slots, world) for s in range(slots)]
            assert all(0 <= rank < world for rank in owners)
            counts = slots_per_rank(slots, world)
            assert sum(counts) == slots  # every slot has exactly one owner
            assert set(counts) <= {slots // world, -(-slots // world)}
            if slots % world == 0:
                assert owners == [s % world for s in range(slots)]  # as before: existing runs unchanged
            elif slots > world:
                assert counts[0] == slots // world  # rank 0 (it also publishes) never takes an extra slot
            # the ranks' own view agrees with the driver's
            assert [[s for s in range(slots) if Shard(r, world).owns(s, slots)] for r in range(world)] == \
                [[s for s in range(slots) if owners[s] == r] for r in range(world)]


def test_slot_balance_says_what_an_uneven_partition_costs():
    uneven = slot_balance(48, 5)
    assert (uneven.busiest, uneven.ideal, uneven.even_rank_counts) == (10, 9.6, (4, 6))
    assert uneven.idle_share == pytest.approx((5 * 10 - 48) / (5 * 10))  # 0.04
    assert uneven.busiest == max(slots_per_rank(48, 5))
    assert uneven.describe() == (
        "48 slots over 5 learner ranks: the busiest trains 10, the ideal 9.6; 4% of learner time idle each "
        "iteration; L = 4 or 6 divides 48 evenly (ranks 2–4 train 10, ranks 0–1 train 9: rank 0, which also "
        "publishes, is among the lighter)")
    assert slot_balance(7, 2).describe().startswith(
        "7 slots over 2 learner ranks: the busiest trains 4, the ideal 3.5; 12.5% of learner time idle each "
        "iteration; L = 1 or 7 divides 7 evenly (rank 1 trains 4, rank 0 trains 3:")
    assert slot_balance(48, 47).even_rank_counts == (24, 48)
    even = slot_balance(48, 4)
    assert (even.even, even.busiest, even.idle_share, even.even_rank_counts) == (True, 12, 0.0, ())
    assert even.describe() == "48 slots over 4 learner ranks: 12 each, none idle"
    assert slot_balance(48, 1).describe() == "48 slots on one learner rank: nothing to balance"


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_two_ranks_train_like_one_learner(objective, two_ranks):
    overrides = OBJECTIVES[objective]
    ranks = two_ranks(objective)
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
    # abs: flow_grpo's loss sums its optimizer steps' near-opposite losses (≈ 1e-5 of ≈ 0.4 each)
    assert [m["loss"] for m in group] == pytest.approx([m["loss"] for m in history], rel=1e-4, abs=1e-6)


def test_micro_batches_are_cut_from_the_whole_batch_on_every_rank():
    """Each rank's parts of micro-batch m together are the whole batch's positions [m·size, (m + 1)·size), and
    every rank has a part (maybe empty) of each, so they meet at every micro-batch."""
    whole, size = 40, 7
    for world in (1, 2, 3, 5):
        ranks = [torch.tensor([p for p in range(whole) if owner_of(p // 8, 5, world) == r]) for r in range(world)]
        parts = [micro_batches(rows, whole, size) for rows in ranks]
        assert {len(p) for p in parts} == {6}
        for m in range(6):
            together = sorted(int(p) for rows, rank_parts in zip(ranks, parts, strict=True)
                              for p in rows[rank_parts[m]])
            assert together == list(range(m * size, min((m + 1) * size, whole)))


def test_a_nan_drops_the_same_samples_in_a_learner_group_as_in_one_learner(two_ranks):
    """Before, each rank cut micro-batches from its own rows: rank 1 dropped rows 4–6 where one learner drops
    3–5, and the steps differed. Now both ranks drop the whole batch's micro-batch [3, 6) together."""
    ranks = two_ranks("nan")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        alone = _nan_update(Trainer(tiny_config(*NAN_SETS)), [0, 1])
    finally:
        torch.set_num_threads(threads)
    trained = int(0.6 * 4)  # ⌊timestep_fraction · steps⌋: the NaN micro-batch is dropped at each
    assert alone["metrics"]["dropped_micro_batches"] == trained
    assert all(r["metrics"]["dropped_micro_batches"] == trained for r in ranks)
    theta = alone["theta"]
    worst = max(float((ranks[0]["theta"][k] - theta[k]).abs().max()) for k in theta)
    assert worst <= TOLERANCE, worst
    assert max(float(theta[k].abs().max()) for k in theta if ".lora_B." in k) > 100 * TOLERANCE


def test_a_rendezvous_nobody_answers_ends_in_one_line_within_the_timeout():
    address = f"tcp://127.0.0.1:{_free_port()}"  # closed again: nothing listens there
    with pytest.raises(LearnerGroupUnreachable) as caught:
        join(address, Shard(1, 2), timeout_s=2)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"learner rank 1 on host {socket.gethostname()} (127.0.0.1) could not reach rank 0's "
                              f"rendezvous at {address} within 2 s (")
    assert "cluster.learner.collective_timeout_s" in message


def test_an_interface_this_host_lacks_is_refused_before_anything_connects():
    with pytest.raises(LearnerGroupUnreachable, match=r"^learner rank 1 on 127\.0\.0\.1: cluster\.learner\.network\."
                                                      r"interface='nope0': host .* has no such interface"):
        join(f"tcp://127.0.0.1:{_free_port()}", Shard(1, 2), timeout_s=2, interface="nope0")
