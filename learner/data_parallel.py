"""The learner group's data parallelism: which slots a rank owns, and the collectives that keep ranks equal.

L learner ranks (one per GPU) split each iteration's prompt slots: rank r owns the slots s with
s mod L = r, regenerates their kept seeds and computes the loss on their samples. What must be the same
on every rank is made the same by `torch.distributed` collectives (NCCL on GPUs, gloo on CPU), in the
process group every rank joins inside its Ray actor (the pattern of verl, OpenRLHF and NeMo-RL):

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

import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


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

    def owns(self, slot: int) -> bool:
        return owner_of(slot, self.world) == self.rank

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


def owner_of(slot: int, world: int) -> int:
    """The rank that regenerates and trains `slot`: a deterministic partition by slot."""
    return slot % world


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


def join(address: str, shard: Shard, timeout_s: float) -> None:
    """Join the learner group's process group. A collective that waits longer than `timeout_s` (a rank
    died and the driver could not end the job) raises instead of hanging."""
    if shard.world == 1:
        return
    backend = backend_for_device()
    if backend == "nccl":
        torch.cuda.set_device(0)  # Ray gives each rank its own GPU as device 0
    dist.init_process_group(backend, init_method=address, rank=shard.rank, world_size=shard.world,
                            timeout=timedelta(seconds=timeout_s))
