"""Shared fixtures. No test reaches a network: the hub is switched off before anything imports it."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
import torch

# Two torch threads, the cores of the machines the suite is sized for; under pytest-xdist (`make test` runs a
# worker per core) each worker takes its share, so parallel workers do not oversubscribe the cores.
THREADS = max(1, 2 // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
torch.set_num_threads(THREADS)


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """Each test starts with the worker's share of threads, whatever the test before set (`bench.demo.main`, run
    in-process, takes 2): two workers of 2 threads on 2 cores spin in each other's OpenMP barriers, and the
    in-process training tests after such a test took 3-30x their CPU (measured: 1.3 s alone, 40-49 s there)."""
    yield
    torch.set_num_threads(THREADS)


@pytest.fixture(scope="session")
def embedded_policy():
    """The committed embedded model, loaded through the same loader as SD3.5."""
    from diffusion.config import EMBEDDED_MODEL
    from diffusion.loading import load_policy

    return load_policy(EMBEDDED_MODEL)


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory) -> Callable:
    """`tiny_folder(family)`: the folder of that family's tiny pipeline (`python -m diffusion.tiny`),
    built once per session; `tiny_folder.pipeline(family)` is the diffusers pipeline it was saved from."""
    from diffusion.tiny import build_tiny_pipeline

    pipelines, folders = {}, {}

    def folder(family: str):
        if family not in folders:
            pipelines[family] = build_tiny_pipeline(family, seed=0)
            folders[family] = tmp_path_factory.mktemp(f"tiny_{family}")
            pipelines[family].save_pretrained(folders[family], safe_serialization=True)
        return folders[family]

    def pipeline(family: str):
        folder(family)
        return pipelines[family]

    folder.pipeline = pipeline
    return folder


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face cache (fill it with `tests/hub_cache.cache_repo`), offline, for this process and its
    children: huggingface_hub reads the cache location at import, so its constant is set as well as the env."""
    from huggingface_hub import constants

    cache = Path(tmp_path) / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


@pytest.fixture(scope="session")
def small_trainer() -> Callable:
    """`small_trainer(*overrides, run_dir=None)`: a single-process Trainer at the tiny scale (tests/tiny.py)."""
    from tiny import tiny_config

    from learner.trainer import Trainer

    def make(*overrides: str, run_dir=None) -> Trainer:
        return Trainer(tiny_config(*overrides), run_dir=run_dir)

    return make


# address "local": always a new local Ray, never one that another test (or session) started with `ray start`,
# which ray.init would otherwise join through /tmp/ray/ray_current_cluster.
RAY_OPTIONS = {"address": "local", "num_cpus": 2, "include_dashboard": False, "log_to_driver": False,
               "configure_logging": False}


@pytest.fixture(scope="session")
def _shared_ray():
    """At the end of the session, stops the local Ray that `local_ray` started in this process."""
    yield
    import ray

    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture
def local_ray(_shared_ray):
    """A local Ray of 2 CPUs, shared by every test of this process that asks for it: started on first use, and
    again after a test that ran its own cluster (`own_ray`, or tests/cluster/test_lost_node.py's nodes) and shut
    it down. Each start costs seconds of CPU in a raylet, a GCS and an agent: started per module, it was started
    ~20 times a run. Every test leaves it as it found it (`no_leftover_actors` checks the named actors)."""
    import ray

    if not ray.is_initialized():
        ray.init(**RAY_OPTIONS)
    yield


@pytest.fixture
def own_ray() -> None:
    """For a test that starts a Ray of its own (other resources, other environment): the shared one stops first."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture
def restart_sync_service() -> Callable:
    """Kill a WeightSyncService and wait until its restarted, empty successor answers. `ray.kill` is
    asynchronous: the call right after it may still reach the old actor."""
    import ray

    def restart(service) -> None:
        ray.kill(service, no_restart=False)
        deadline = time.time() + 60
        while ray.get(service.version.remote()) != -1:
            assert time.time() < deadline, "the sync service did not restart"
            time.sleep(0.2)

    return restart


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`gpu`-marked tests skip where no CUDA device is (every CI and developer machine here)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (python -m bench.gpu_check runs the gpu-marked tests there)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
