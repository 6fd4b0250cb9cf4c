"""The planned GPU path (not wired in): its choice of transport (everywhere) and its CUDA IPC handles (where a
GPU is present)."""

from __future__ import annotations

import pytest
import torch

from weight_sync.planned_gpu_path import GPU_MIN_BYTES, export_ipc, import_ipc, ipc_env, plan_transport


def test_full_weight_payloads_on_a_gpu_go_gpu_to_gpu_and_the_rest_through_host_memory():
    big, small = GPU_MIN_BYTES, GPU_MIN_BYTES - 1
    assert plan_transport("a", "a", big, on_gpu=True) == "cuda_ipc"
    assert plan_transport("a", "b", big, on_gpu=True) == "nccl"
    assert plan_transport("a", "a", small, on_gpu=True) == "shm"
    assert plan_transport("a", "b", small, on_gpu=True) == "object_store"
    assert plan_transport("a", "a", big, on_gpu=False) == "shm"
    assert ipc_env()["env_vars"]["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] == "1"


def test_cpu_tensors_cannot_travel_by_cuda_ipc():
    with pytest.raises(ValueError, match="not on a GPU"):
        export_ipc({"w": torch.zeros(2)})


@pytest.mark.gpu
def test_cuda_ipc_handles_copy_into_preallocated_engine_tensors():
    import pickle

    import torch.multiprocessing as mp

    source = {"w": torch.arange(1024, dtype=torch.float32, device="cuda")}
    handles = pickle.loads(pickle.dumps(export_ipc(source)))
    target = {"w": torch.zeros(1024, device="cuda")}
    # In one process torch rebuilds the very storage; across processes the same call opens the handle.
    import_ipc(handles, into=target)
    assert torch.equal(target["w"], source["w"])
    assert mp.get_sharing_strategy() in mp.get_all_sharing_strategies()


def _receive(handles: dict, out) -> None:
    """In a second process: open the handles, copy into its own preallocated tensor, report a checksum."""
    target = {"w": torch.zeros(1 << 20, device="cuda")}
    import_ipc(handles, into=target)
    torch.cuda.synchronize()
    out.put(float(target["w"].double().sum()))


@pytest.mark.gpu
def test_cuda_ipc_weights_reach_another_process():
    import torch.multiprocessing as mp

    source = {"w": torch.arange(1 << 20, dtype=torch.float32, device="cuda")}
    context = mp.get_context("spawn")
    out = context.Queue()
    reader = context.Process(target=_receive, args=(export_ipc(source), out))
    reader.start()
    try:
        assert out.get(timeout=120) == float(source["w"].double().sum())
    finally:
        reader.join(timeout=60)
    assert reader.exitcode == 0
