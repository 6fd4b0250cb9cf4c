"""Planned, not wired in: the GPU path for full-weight payloads (CUDA IPC within a node, NCCL across).

Nothing at runtime imports this module: weight sync runs through host memory today (`weight_sync.shm`
on a node, the object store across nodes; `WeightPublisher` chooses). What is here is the part of the GPU
path that can be tested now, kept beside the design so the wiring starts from tested pieces:
`plan_transport` (which transport a reader's snapshot would take: the publisher's host-memory choice,
extended to the GPU), and `export_ipc` / `import_ipc` (CUDA IPC handles through torch's own reductions;
their test runs where CUDA is present). Not built: the NCCL broadcast group and the publisher/subscriber
wiring.

Why: a dense FLUX.1 transformer is 23.8 GB; through host memory it goes device → host → shared memory →
host → device, while GPU to GPU it is NVLink/PCIe peer copies within a node and one NCCL broadcast across
nodes. Precedents: checkpoint-engine, slime and verl share the trainer's weights with
co-located inference engines through CUDA IPC handles and broadcast them over NCCL to other nodes.

Ray settings the GPU path needs:
- CUDA IPC: Ray sets CUDA_VISIBLE_DEVICES to each actor's own GPU, so a receiver does not see the
  producer's device and the handle's device index means another GPU in each process. Start the job with
  `runtime_env={"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}}` (every actor then
  sees every GPU of its node; Ray still reserves GPUs by `num_gpus`), and in each actor
  `torch.cuda.set_device(int(ray.get_gpu_ids()[0]))` before allocating: indices then agree across
  processes, which `ipc_env()` / `device_of_actor()` encode. In containers, also share the IPC namespace.
- NCCL across nodes: one process group per job (learner rank 0, one explorer per node as receiver,
  which then fans out over CUDA IPC on its node), created with `torch.distributed.init_process_group(
  "nccl", init_method="tcp://<learner host>:<port>", world_size, rank)` in each actor, or
  `ray.util.collective.create_collective_group`; broadcast in buckets (e.g. 512 MB) into preallocated
  engine tensors; set NCCL_SOCKET_IFNAME / NCCL_IB_HCA to the cluster's fabric.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import torch

Transport = Literal["cuda_ipc", "nccl", "shm", "object_store"]
GPU_MIN_BYTES = 2 * 2**30  # below this, one host hop costs well under a second: host paths suffice


def plan_transport(publisher_node: str, reader_node: str, nbytes: int, *, on_gpu: bool,
                   gpu_min_bytes: int = GPU_MIN_BYTES) -> Transport:
    """The transport a snapshot of `nbytes` would take to a reader: GPU to GPU for full-weight payloads whose
    source lives on a GPU, else through host memory (the region on the same node, the store across)."""
    same_node = publisher_node == reader_node
    if on_gpu and nbytes >= gpu_min_bytes:
        return "cuda_ipc" if same_node else "nccl"
    return "shm" if same_node else "object_store"


def ipc_env() -> dict[str, Any]:
    """The runtime_env a job needs for CUDA IPC between its actors (see the module docstring)."""
    return {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}}


def device_of_actor() -> torch.device:
    """This actor's GPU under `ipc_env()`: its reserved GPU id is then also its device index."""
    import ray

    ids = ray.get_gpu_ids()
    if not ids:
        raise RuntimeError("this actor reserved no GPU (num_gpus=0)")
    return torch.device("cuda", int(ids[0]))


def export_ipc(tensors: Mapping[str, torch.Tensor]) -> dict[str, tuple]:
    """Picklable CUDA IPC handles of `tensors` (no copy). The producer must keep the tensors alive and
    unchanged until every reader copied them (the next publish writes a second buffer: double-buffer)."""
    from torch.multiprocessing.reductions import reduce_tensor

    handles = {}
    for name, tensor in tensors.items():
        if not tensor.is_cuda:
            raise ValueError(f"{name!r} is not on a GPU: CUDA IPC shares device memory only")
        handles[name] = reduce_tensor(tensor.contiguous())
    return handles


def import_ipc(handles: Mapping[str, tuple], into: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The producer's tensors mapped in this process; with `into`, copied into those (the engine's) and
    the mapping dropped at once, so the producer may reuse its buffer after this returns."""
    out = {}
    for name, (rebuild, args) in handles.items():
        shared = rebuild(*args)
        if into is not None:
            into[name].copy_(shared, non_blocking=False)
            out[name] = into[name]
            del shared
        else:
            out[name] = shared
    if into is not None:
        torch.cuda.synchronize()
    return out
