"""The shared-memory path: the seqlock region alone (its size, its room in /dev/shm), then through the services
on a real local Ray, and their fallback to the object store when /dev/shm has no room."""

from __future__ import annotations

import errno
import multiprocessing
import os
import sys
import threading
import time
import uuid

import numpy as np
import pytest
import ray
import torch

from weight_sync.codecs import encode
from weight_sync.publisher import WeightPublisher
from weight_sync.service import WeightSyncService, start_services, stop_services
from weight_sync.shm import (
    SHM_FOLDER,
    Region,
    TornRead,
    leaked,
    region_bytes,
    region_prefix,
    region_shortfall,
    shm_free_bytes,
    size_text,
    slot_capacity,
)
from weight_sync.subscriber import WeightSubscriber

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the actors below

TENSORS, ELEMENTS = 4, 2**18  # 4 MB a snapshot: long enough writes for readers to be overtaken


def _snapshot(version: int, n: int = ELEMENTS) -> dict[str, torch.Tensor]:
    return {f"w{i}": torch.full((n,), float(version) + i) for i in range(TENSORS)}


def _name() -> str:
    return f"{region_prefix('test' + uuid.uuid4().hex[:6], 'n' * 12)}0"


def test_region_keeps_the_two_newest_versions_and_reads_them_whole():
    owner = Region.create(_name(), 2**16)
    try:
        reader = Region.attach(owner.name)
        assert reader.versions() == (-1, -1)
        assert reader.read(lambda m, a: None) is None  # nothing written yet
        writer = Region.attach(owner.name)
        for version in (1, 2):
            arrays, manifest = encode(_snapshot(version, 64), "dense", version=version)
            writer.write(manifest.to_json(), arrays)
        assert reader.versions() == (2, 1)
        held, (version, w1) = reader.read(lambda m, a: (m["version"], a["w1"].copy()))
        assert held == version == 2 and np.array_equal(w1, np.full(64, 3.0, np.float32))
        assert reader.read(lambda m, a: float(a["w0"][0]), version=1) == (1, 1.0)  # the older slot
        arrays, manifest = encode(_snapshot(3, 64), "dense", version=3)
        writer.write(manifest.to_json(), arrays)
        assert reader.read(lambda m, a: None, version=1) is None  # overwritten by v3
        assert writer.write(manifest.to_json(), arrays) == 0 and reader.versions() == (3, 2)  # a retry: ignored
        stale, stale_manifest = encode(_snapshot(1, 64), "dense", version=1)
        assert writer.write(stale_manifest.to_json(), stale) == 0 and reader.versions() == (3, 2)  # never back
        with pytest.raises(ValueError, match="exceeds the slot capacity"):
            writer.write(encode(_snapshot(4), "dense", version=4)[1].to_json(), encode(_snapshot(4), "dense",
                                                                                       version=4)[0])
        assert reader.versions() == (3, 2)  # a refused write changes nothing
        writer.close()
        reader.close()
    finally:
        owner.unlink()
    assert owner.name not in leaked()


def test_a_region_takes_region_bytes_of_dev_shm_all_reserved_when_made():
    """Before: the pages were handed out only when written, so a region larger than /dev/shm's free space was
    made and its writer died of SIGBUS later. Now every page is reserved by `Region.create` itself."""
    nbytes = 3 * 2**20 + 5
    assert slot_capacity(nbytes) == 3 * 2**20 + 3 * 2**17 + 2**16 + 4096  # + an eighth + 64 KiB, in whole pages
    owner = Region.create(_name(), slot_capacity(nbytes))
    try:
        stat = os.stat(os.path.join(SHM_FOLDER, owner.name))
        assert stat.st_size == region_bytes(nbytes) == 4096 + 2 * slot_capacity(nbytes)
        assert stat.st_blocks * 512 >= region_bytes(nbytes)  # allocated, not a sparse promise
    finally:
        owner.unlink()
    st = os.statvfs(SHM_FOLDER)
    with pytest.raises(OSError) as info:  # more than the whole tmpfs: refused at once, nothing left behind
        Region.create(_name(), st.f_blocks * st.f_frsize)
    assert info.value.errno == errno.ENOSPC and not leaked("test")


def test_whether_a_region_fits_is_decided_on_the_free_space_given():
    assert region_shortfall(10 * 2**20, 16 * 2**20) == (
        "/dev/shm has 16.0 MiB free, the weight-sync region needs 22.6 MiB (2 slots for snapshots of 10.0 MiB): "
        "snapshots go through Ray's object store instead (slower); to use shared memory give /dev/shm 6.6 MiB more "
        "room (docker run --shm-size=1g or more; else mount -o remount,size=<larger> /dev/shm)")
    assert region_shortfall(10 * 2**20, region_bytes(10 * 2**20)) is None  # exactly enough
    assert region_shortfall(10 * 2**20, None) is None  # no /dev/shm to ask: try, and catch the OSError
    free = shm_free_bytes()  # this machine's, from statvfs
    st = os.statvfs(SHM_FOLDER)
    assert free is not None and abs(free - st.f_bavail * st.f_frsize) < 2**30
    assert region_shortfall(2**20, free) is None
    assert region_shortfall(free, free).startswith(f"/dev/shm has {size_text(free)} free, the weight-sync region "
                                                   f"needs {size_text(region_bytes(free))}")
    assert shm_free_bytes(os.path.join(SHM_FOLDER, "no-such-folder")) is None


def _writer(name: str, first: int, last: int) -> None:
    region = Region.attach(name)
    for version in range(first, last + 1):
        arrays, manifest = encode(_snapshot(version), "dense", version=version, checksums=False)
        region.write(manifest.to_json(), arrays)
    region.close()


def test_concurrent_writer_and_readers_never_use_a_torn_snapshot():
    """A writer process publishes 150 versions while 2 reader threads read whole snapshots: reads the
    writer overtook are detected (and retried), none is accepted mixed, versions never go back."""
    owner = Region.create(_name(), TENSORS * ELEMENTS * 4 + 2**16)
    first, last = 1, 150
    counts = {"accepted": 0, "torn_seen": 0, "torn_used": 0, "regressions": 0}
    lock = threading.Lock()
    try:
        _writer(owner.name, 0, 0)
        proc = multiprocessing.get_context("spawn").Process(target=_writer, args=(owner.name, first, last))

        def consume(manifest: dict, arrays: dict) -> tuple[int, bool]:
            version = manifest["version"]
            whole = all(np.all(arrays[f"w{i}"] == version + i) for i in range(TENSORS))
            return version, whole

        def reader() -> None:
            region, newest = Region.attach(owner.name), -1
            while proc.is_alive() or proc.exitcode is None:
                held, (version, whole) = region.read(consume)
                with lock:
                    counts["accepted"] += 1
                    counts["torn_used"] += not whole or held != version
                    counts["regressions"] += held < newest
                newest = held
            with lock:
                counts["torn_seen"] += region.torn
            region.close()

        proc.start()
        threads = [threading.Thread(target=reader) for _ in range(2)]
        for t in threads:
            t.start()
        proc.join(120)
        for t in threads:
            t.join()
        assert proc.exitcode == 0
        final = Region.attach(owner.name)
        assert final.read(lambda m, a: float(a["w0"][0])) == (last, float(last))
        final.close()
    finally:
        owner.unlink()
    print(f"shm stress: {counts}")
    assert counts["torn_used"] == 0 and counts["regressions"] == 0, counts
    assert counts["accepted"] >= 20, counts


def test_a_reader_always_overtaken_gives_up_loudly():
    owner = Region.create(_name(), 2**16)
    try:
        arrays, manifest = encode(_snapshot(1, 8), "dense", version=1)
        owner.write(manifest.to_json(), arrays)

        def overtaken(manifest: dict, arrays: dict) -> None:  # a writer that publishes twice meanwhile
            owner.header[1] += 4

        with pytest.raises(TornRead):
            owner.read(overtaken, retries=3)
        assert owner.torn == 3
    finally:
        owner.unlink()


# -- through the services, on a real local Ray ------------------------------------------------------

@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


class Engine:
    """A stand-in ExploreEngine: copies each loaded state into preallocated tensors, like the real one."""

    def __init__(self, n: int = ELEMENTS) -> None:
        self.weights = {f"w{i}": torch.zeros(n) for i in range(TENSORS)}

    def load(self, state, strict: bool = True, prequantized=()) -> None:
        for name, tensor in state.items():
            self.weights[name].copy_(tensor)

    def holds(self, version: int) -> bool:
        return all(torch.all(self.weights[f"w{i}"] == version + i) for i in range(TENSORS))


def _wait(condition, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, "timed out"
        time.sleep(0.1)


@pytest.mark.ray
def test_same_node_reads_shared_memory_and_another_node_the_object_store(local_ray):
    tag = "mix" + uuid.uuid4().hex[:6]
    services = start_services(keep=2, tag=tag)
    (_, local), = services.items()
    other = ray.remote(num_cpus=0, max_concurrency=4)(WeightSyncService).remote(2, tag + "x")
    services["f" * 56] = other  # a second "node": no region there, so the object store carries it
    publisher = WeightPublisher(services, "dense")
    near, far = WeightSubscriber(local, Engine(64)), WeightSubscriber(other, Engine(64))
    try:
        for version in (1, 2, 3):
            publisher.publish(_snapshot(version, 64), version)
            assert near.poll()["version"] == version and near.engine.holds(version)
            assert far.poll()["version"] == version and far.engine.holds(version)
        assert "shm" in ray.get(local.latest.remote(-1))[1]
        assert "shm" not in ray.get(other.latest.remote(-1))[1]
        assert ray.get(local.stats.remote())["shm"]["versions"] == [3, 2]
        assert near.fetch(2)["version"] == 2 and near.engine.holds(2)  # the older slot, on request
        assert near.fetch(1) is None and near.newest == 3  # released: only two slots
        assert len(leaked(tag)) == 1
    finally:
        stop_services(services)
    _wait(lambda: not leaked(tag))


@pytest.mark.ray
def test_a_service_without_room_in_dev_shm_serves_snapshots_through_the_object_store(local_ray):
    """A node whose /dev/shm cannot hold the region (here: a limit of 0 bytes) gets no region; the publisher
    sends it the snapshots through the object store, and its readers load them from object references."""
    tag = "full" + uuid.uuid4().hex[:6]
    services = start_services(keep=2, tag=tag, shm_limit=0)
    (_, service), = services.items()
    publisher = WeightPublisher(services, "dense")
    subscriber = WeightSubscriber(service, Engine(64))
    try:
        for version in (1, 2):
            publisher.publish(_snapshot(version, 64), version)
            assert subscriber.poll()["version"] == version and subscriber.engine.holds(version)
        version, manifest, refs = ray.get(service.latest.remote(-1))
        assert version == 2 and "shm" not in manifest and len(refs) == 1  # an object reference, no marker
        stats = ray.get(service.stats.remote())
        assert stats["shm"] == {} and stats["versions"] == [1, 2]
        assert stats["shm_unavailable"].startswith("/dev/shm has 0 B free, the weight-sync region needs ")
        assert publisher.local is None and not leaked(tag)
        assert subscriber.fetch(1)["version"] == 1 and subscriber.engine.holds(1)
    finally:
        stop_services(services)


class Source:
    """Publishes the way the learner actor does (its node's service gets the snapshot through the region)."""

    def __init__(self, services) -> None:
        self.publisher = WeightPublisher(services, "dense", source=ray.get_runtime_context().current_actor,
                                         checksums=False)

    def publish(self, first: int, last: int) -> None:
        for version in range(first, last + 1):
            self.publisher.publish(_snapshot(version), version)

    def snapshot(self, version: int):
        return self.publisher.snapshot(version)


@pytest.mark.ray
def test_concurrent_publish_and_fetch_through_shared_memory_never_tear(local_ray):
    """An actor publishes 60 versions back to back into the region; two subscribers poll meanwhile. Each
    load the subscriber returned holds exactly the version it claims (torn reads are retried, counted)."""
    tag = "torn" + uuid.uuid4().hex[:6]
    services = start_services(keep=2, tag=tag)
    service = next(iter(services.values()))
    source = ray.remote(max_concurrency=2, num_cpus=0)(Source).remote(services)
    ray.get(source.publish.remote(0, 0))
    first, last = 1, 60
    errors: list[str] = []
    seen: list[set[int]] = [set(), set()]
    torn = [0, 0]
    done = threading.Event()

    def reader(index: int) -> None:
        subscriber = WeightSubscriber(service, Engine())
        while not done.is_set():
            info = subscriber.poll()
            if info is None:
                continue
            if not subscriber.engine.holds(info["version"]):
                errors.append(f"v{info['version']}: the engine holds a mixed snapshot")
            seen[index].add(info["version"])
        torn[index] = subscriber.torn

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    try:
        ray.get(source.publish.remote(first, last))
        deadline = time.time() + 60  # each reader reaches the last version, however loaded the machine
        while not all(last in s for s in seen) and time.time() < deadline:
            time.sleep(0.05)
    finally:
        done.set()
        for t in threads:
            t.join()
        ray.kill(source, no_restart=True)
        stop_services(services)
    print(f"shm service stress: versions seen {[len(s) for s in seen]}, torn reads retried {torn}")
    assert not errors, errors[:3]
    # reads overlapped the publishing (how many versions a reader catches depends on the machine's load: 3 to 60)
    assert all(len(s) >= 2 for s in seen), [len(s) for s in seen]
    assert all(max(s) == last for s in seen)


@pytest.mark.ray
def test_a_killed_service_leaves_no_region_and_a_restarted_one_gets_a_new_one(local_ray, restart_sync_service):
    tag = "leak" + uuid.uuid4().hex[:6]
    before = set(leaked())
    services = start_services(keep=2, tag=tag)
    (node, service), = services.items()
    publisher = WeightPublisher(services, "dense")
    subscriber = WeightSubscriber(service, Engine(64))
    publisher.publish(_snapshot(1, 64), 1)
    assert subscriber.poll()["version"] == 1
    old = leaked(tag)
    assert len(old) == 1

    restart_sync_service(service)  # killed: its region goes (the restarted service removes stale ones)
    assert not leaked(tag)
    assert publisher.republish() == [node]  # the learner's republish writes into the new region
    new = leaked(tag)
    assert len(new) == 1 and new != old
    publisher.publish(_snapshot(2, 64), 2)
    assert subscriber.poll()["version"] == 2 and subscriber.engine.holds(2)  # it followed the new name

    ray.kill(service, no_restart=True)  # killed for good: its watchdog unlinks the region
    _wait(lambda: not leaked(tag))
    assert set(leaked()) <= before
