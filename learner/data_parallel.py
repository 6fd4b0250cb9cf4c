"""The learner group's data parallelism: which slots a rank owns, and the collectives that keep ranks equal.

L learner ranks (one per GPU) split each iteration's P prompt slots (`owner_of`: s mod L, the short last
round on the last ranks when L does not divide P); a rank regenerates its slots' kept seeds and computes the
loss on their samples. What must be the same on every rank is made the same by `torch.distributed`
collectives (NCCL on GPUs, gloo on CPU), in the process group every rank joins inside its Ray actor (the
pattern of verl, OpenRLHF and NeMo-RL):

    scores      every slot's true rewards (a few floats each) are all-gathered, so every rank computes
                the advantages of the whole batch (their scale is the std over the whole batch)
    gradients   each rank accumulates Σ_{its samples} w_i ∇ℓ_i with w_i = 1 / (samples in the whole
                batch); one all-reduce (sum) over the trainable parameters' flattened gradients gives
                every rank the full batch's gradient before clipping and the AdamW step
    counts      kept micro-batches, sample steps and the loss are summed over ranks

So the optimizer step, the soft update and the EMA are computed from identical inputs on every rank and
the published weights agree without another broadcast. Random draws that span the batch (the trained
timesteps, the training noise) are drawn for the whole batch on every rank and sliced to its rows, so a
rank's samples get exactly the draws they get with one learner.

Why not the `DistributedDataParallel` wrapper: the update runs one module under three parameter views
per micro-batch (θ, θ_old, the reference) and drops a micro-batch whose loss is NaN on one rank only —
DDP's per-backward reducer would then wait forever for the others. Reducing once after accumulation is
what DDP does under `no_sync()` until the last micro-batch, in one bucket.

L = 2 agrees with L = 1 to fp32 rounding, not bit for bit: the sum over the batch is formed in a
different order (per-rank partial sums, then the all-reduce) and the forward passes see smaller
batches, whose matmuls may round differently.
"""

from __future__ import annotations

import json
import re
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from learner import collective_network
from learner.collective_network import Binding


@dataclass(frozen=True)
class Shard:
    """This process's place in the learner group: rank `rank` of `world` (1: no process group)."""

    rank: int = 0
    world: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} is not in a group of {self.world}")

    @property
    def main(self) -> bool:
        """Rank 0 evaluates, logs, checkpoints and publishes."""
        return self.rank == 0

    def owns(self, slot: int, slots: int) -> bool:
        """Whether this rank regenerates and trains `slot` of an iteration's `slots` (`owner_of`)."""
        return owner_of(slot, slots, self.world) == self.rank

    def gather(self, value: Any) -> list[Any]:
        """Every rank's `value` (small, picklable), in rank order."""
        if self.world == 1:
            return [value]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, value)
        return out

    def sum(self, values: dict[str, float]) -> dict[str, float]:
        """Each value summed over the ranks (in float64: counts stay exact)."""
        if self.world == 1:
            return dict(values)
        keys = sorted(values)
        t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=_device())
        dist.all_reduce(t)
        return {k: float(v) for k, v in zip(keys, t.tolist(), strict=True)}

    def every(self, flag: bool) -> bool:
        """Whether `flag` holds on every rank (each rank must call it, in the same order)."""
        if self.world == 1:
            return flag
        t = torch.tensor([1.0 if flag else 0.0], dtype=torch.float64, device=_device())
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return bool(t.item() == 1.0)

    def sum_gradients(self, parameters: list[torch.nn.Parameter]) -> None:
        """∇ ← Σ_ranks ∇, in place, for every trainable parameter (one without a gradient counts as 0)."""
        if self.world == 1:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        offset = 0
        for p in parameters:
            n = p.numel()
            p.grad = flat[offset:offset + n].view_as(p).clone()
            offset += n


ALONE = Shard()  # a learner without a group


def owner_of(slot: int, slots: int, world: int) -> int:
    """The rank that regenerates and trains `slot` of an iteration's P = `slots` over L = `world` ranks.

    With P = q·L + r (0 ≤ r < L): the first q·L slots go round-robin, slot s to rank s mod L; the last r
    (one short round) go to the last r ranks, slot q·L + j to rank L − r + j. So ranks L − r … L − 1 train
    q + 1 = ceil(P/L) slots and ranks 0 … L − r − 1 train q = floor(P/L): slots all cost the same, so no
    partition has a lighter busiest rank, and rank 0, which also publishes, evaluates and checkpoints, never
    takes an extra slot while another rank can. When L divides P this is s mod L exactly.

    A pure function of (s, P, L): the driver, which streams each group to its rank, and every rank agree
    without talking. By slot rather than by sample, so that a group can go to its rank as it arrives."""
    if world < 1:
        raise ValueError(f"a learner group has at least 1 rank (given {world})")
    if not 0 <= slot < slots:
        raise ValueError(f"slot {slot} is not one of the iteration's {slots} slots")
    full_rounds = slots - slots % world  # q·L
    if slot < full_rounds:
        return slot % world
    return world - slots % world + (slot - full_rounds)


@dataclass(frozen=True)
class SlotBalance:
    """How evenly `owner_of` spreads P = `slots` over L = `ranks`, and what the unevenness costs: every rank
    waits each iteration for the busiest, so the group's time is set by ceil(P/L) slots."""

    slots: int
    ranks: int
    busiest: int  # slots on the busiest rank: ceil(P/L)
    ideal: float  # P/L, what each rank would train if slots were divisible
    idle_share: float  # of the group's rank-time per iteration: (L·ceil(P/L) − P) / (L·ceil(P/L))
    even_rank_counts: tuple[int, ...]  # the nearest L below and above (at most P) that divide P; () when L does

    @property
    def even(self) -> bool:
        return self.slots % self.ranks == 0

    def describe(self) -> str:
        """In words, e.g. "48 slots over 5 learner ranks: the busiest trains 10, the ideal 9.6; 4% of
        learner time idle each iteration; L = 4 or 6 divides 48 evenly"."""
        p, n = self.slots, self.ranks
        if n == 1:
            return f"{p} slots on one learner rank: nothing to balance"
        if self.even:
            return f"{p} slots over {n} learner ranks: {self.busiest} each, none idle"
        heavy = p % n  # the last `heavy` ranks train one slot more (owner_of)
        return (f"{p} slots over {n} learner ranks: the busiest trains {self.busiest}, the ideal "
                f"{_decimal(self.ideal, 2)}; {_decimal(100 * self.idle_share, 1)}% of learner time idle each "
                f"iteration; L = {' or '.join(map(str, self.even_rank_counts))} divides {p} evenly "
                f"({_ranks_train(n - heavy, n - 1, self.busiest)}, {_ranks_train(0, n - heavy - 1, self.busiest - 1)}: "
                "rank 0, which also publishes, is among the lighter)")


def slot_balance(slots: int, ranks: int) -> SlotBalance:
    """What `owner_of` gives P = `slots` over L = `ranks`: the busiest rank's ceil(P/L) slots against the
    ideal P/L, the rank-time idle per iteration (L·ceil(P/L) − P) / (L·ceil(P/L)), and the nearest L that
    divide P (the largest divisor below L and the smallest above it, up to P)."""
    if slots < 1 or ranks < 1:
        raise ValueError(f"{slots} slots over {ranks} learner ranks: both must be at least 1")
    busiest = -(-slots // ranks)
    below = max(d for d in range(1, ranks) if slots % d == 0) if ranks > 1 else None
    above = min((d for d in range(ranks + 1, slots + 1) if slots % d == 0), default=None)
    even = () if slots % ranks == 0 else tuple(d for d in (below, above) if d is not None)
    return SlotBalance(slots, ranks, busiest, slots / ranks, (ranks * busiest - slots) / (ranks * busiest), even)


def _ranks_train(first: int, last: int, slots: int) -> str:
    return f"rank {first} trains {slots}" if first == last else f"ranks {first}–{last} train {slots}"


def _decimal(value: float, places: int) -> str:
    """`value` to `places` decimals without trailing zeros (9.6, 12, 6.86); a tiny value keeps a digit."""
    if 0 < value < 10**-places:
        return f"{value:.1g}"
    return f"{value:.{places}f}".rstrip("0").rstrip(".")


def _device() -> torch.device:
    return torch.device("cuda") if dist.is_initialized() and dist.get_backend() == "nccl" else torch.device("cpu")


def backend_for_device() -> str:
    """NCCL where the rank holds a GPU, gloo on CPU."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def free_address() -> str:
    """tcp://host:port on this node with a port free now: rank 0's rendezvous address."""
    import ray  # only rank 0's actor asks; the trainer itself never needs Ray

    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return f"tcp://{ray.util.get_node_ip_address()}:{port}"


class LearnerGroupUnreachable(RuntimeError):
    """A rank could not reach the group's rendezvous or its peers: one line naming the rank, its host, the
    addresses each side used and what to set."""


FIX = ("set cluster.learner.network.interface (or .subnet) to an interface the learner nodes reach each other "
       "on, or GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME in the job's environment")


def join(address: str, shard: Shard, timeout_s: float, *, node_ip: str = "127.0.0.1", interface: str | None = None,
         subnet: str | None = None) -> Binding:
    """Join the learner group's process group, its collectives bound to the interface
    `collective_network.choose` picks (returned). A collective that waits longer than `timeout_s` (a rank
    died and the driver could not end the job) raises instead of hanging; a rendezvous or mesh connect
    that fails within it raises `LearnerGroupUnreachable`.

    Each rank writes where it listens into the rendezvous store before the mesh forms, so a failed
    connect names both sides."""
    if shard.world == 1:
        return Binding(None, None, "a single learner, which joins no group")
    try:
        binding = collective_network.choose(node_ip, interface=interface, subnet=subnet)
    except ValueError as exc:  # an interface or subnet this host lacks: before anything connects
        raise LearnerGroupUnreachable(f"learner rank {shard.rank} on {node_ip}: {exc}") from None
    collective_network.apply(binding)
    backend = backend_for_device()
    if backend == "nccl":
        torch.cuda.set_device(0)  # Ray gives each rank its own GPU as device 0
    me = {"rank": shard.rank, "host": f"{socket.gethostname()} ({node_ip})", "binding": binding.describe()}
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    timeout = timedelta(seconds=timeout_s)
    try:
        store = dist.TCPStore(host, int(port), shard.world, is_master=shard.main, timeout=timeout)
    except Exception as exc:  # DistStoreError / RuntimeError, by torch version
        side = ("waited for the other ranks at" if shard.main else "could not reach rank 0's rendezvous at")
        raise LearnerGroupUnreachable(
            f"learner rank {shard.rank} on host {me['host']} {side} {address} within {timeout_s:g} s "
            f"({_first_line(exc)}): that port of rank 0's node must be open to every learner node; "
            f"cluster.learner.collective_timeout_s bounds the wait") from None
    store.set(f"solrl/rank/{shard.rank}", json.dumps(me))
    try:
        dist.init_process_group(backend, store=store, rank=shard.rank, world_size=shard.world, timeout=timeout)
        dist.all_reduce(torch.zeros(1, device=_device()))  # NCCL connects at its first collective
    except Exception as exc:
        raise LearnerGroupUnreachable(_mesh_failure(shard, me, store, exc, timeout_s)) from None
    return binding


def _mesh_failure(shard: Shard, me: dict, store: dist.Store, exc: Exception, timeout_s: float) -> str:
    """One line: this rank, where it listened, the peers' own accounts (from the store) and the address dialed."""
    peers = []
    for rank in range(shard.world):
        key = f"solrl/rank/{rank}"
        if rank != shard.rank and store.check([key]):
            peer = json.loads(store.get(key))
            peers.append(f"rank {rank} on host {peer['host']} listens on {peer['binding']}")
    dialed = re.search(r"remote=\[([^\]]+)\]:(\d+)", str(exc))
    return (f"learner rank {shard.rank} on host {me['host']} could not connect the learner group's "
            f"{dist.get_backend() if dist.is_initialized() else backend_for_device()} mesh within {timeout_s:g} s: "
            f"it listens on {me['binding']}; " + "; ".join(peers or ["the other ranks did not say where they listen"])
            + (f"; it dialed {dialed.group(1)}:{dialed.group(2)}" if dialed else "")
            + f" ({_first_line(exc)}). To fix: {FIX}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__
