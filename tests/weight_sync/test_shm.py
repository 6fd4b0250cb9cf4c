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

from weight_sync.codecs import CorruptSnapshot, encode
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


# -- the pipelined protocol: readers that follow a write in progress ---------------------------------

class _Into:
    """A sink that streams every array into `dest` and logs what it saw (`hook` runs on each arrival)."""

    def __init__(self, dest: dict[str, torch.Tensor], hook=None) -> None:
        self.dest, self.hook, self.log = dest, hook, []

    def begin(self, manifest: dict, layout: dict) -> dict[str, torch.Tensor]:
        self.log.append(("begin", manifest["version"]))
        return self.dest

    def arrived(self, key: str, view: np.ndarray) -> None:
        self.log.append((key, float(view[0])))
        if self.hook is not None:
            self.hook(key)

    def end(self) -> None:
        self.log.append(("end",))


def _uniform(version: int, n: int) -> tuple[dict, dict[str, np.ndarray]]:
    """A snapshot whose every element is its version: any mix of two versions shows."""
    arrays, manifest = encode({f"w{i}": torch.full((n,), float(version)) for i in range(TENSORS)}, "dense",
                              version=version, checksums=False)
    return manifest.to_json(), arrays


def _until(condition) -> None:
    deadline = time.time() + 20  # a bound for a hung reader, not a timing expectation
    while not condition():
        assert time.time() < deadline, "the reader made no progress"
        time.sleep(0.001)


def test_a_reader_follows_a_write_chunk_by_chunk_and_is_retried_when_the_writer_laps_it():
    """A reader that starts while v3 is being written copies each chunk as soon as the writer publishes it
    and not before (v3's second chunk stays unread until written). Held up at w1 while the writer finishes
    v3, writes v4 and starts v5 into v3's slot, it finds itself overtaken, starts again, follows v5 and
    accepts it whole; v3 is gone, v4 still there."""
    n, chunk = 1024, 1024  # 4 KiB arrays: 4 chunks each
    owner = Region.create(_name(), 2**20)
    writer, reader = Region.attach(owner.name), Region.attach(owner.name)
    try:
        writer.write(*_uniform(1, n))
        writer.write(*_uniform(2, n))
        v3 = writer.write_steps(*_uniform(3, n), chunk=chunk)
        next(v3), next(v3)  # the manifest, then w0's first chunk
        assert reader.writing() == 3 and reader.versions() == (2, 1)
        held_up, go = threading.Event(), threading.Event()

        def hook(key: str) -> None:
            if key == "w1" and not go.is_set():
                held_up.set()
                go.wait()

        dest = {f"w{i}": torch.zeros(n) for i in range(TENSORS)}
        sink = _Into(dest, hook)
        result: list = []
        thread = threading.Thread(target=lambda: result.append(reader.read_into(sink)))
        thread.start()
        quarter = n // 4
        _until(lambda: bool(torch.all(dest["w0"][:quarter] == 3)))
        assert torch.all(dest["w0"][quarter:] == 0)  # not yet written, so not copied
        next(v3)
        _until(lambda: bool(torch.all(dest["w0"][:2 * quarter] == 3)))
        assert torch.all(dest["w0"][2 * quarter:] == 0)
        for _ in v3:  # v3 complete; the reader copies w1 and waits in the hook
            pass
        _until(held_up.is_set)
        writer.write(*_uniform(4, n))
        v5 = writer.write_steps(*_uniform(5, n), chunk=chunk)
        next(v5), next(v5)  # v5 now rewrites v3's slot
        go.set()
        _until(lambda: ("begin", 5) in sink.log)  # the retry follows v5
        for _ in v5:
            pass
        thread.join()
        assert result == [5] and reader.torn == 1 and reader.followed == 1
        assert sink.log[:4] == [("begin", 3), ("w0", 3.0), ("w1", 3.0), ("begin", 5)]
        assert sink.log[4:] == [*((f"w{i}", 5.0) for i in range(TENSORS)), ("end",)]
        assert all(torch.all(d == 5) for d in dest.values())
        assert reader.read_into(_Into(dest), version=3) is None  # its slot holds v5 now
        assert reader.read_into(_Into(dest), version=4) == 4 and all(torch.all(d == 4) for d in dest.values())
        assert reader.read(lambda m, a: float(a["w2"][7])) == (5, 5.0)
    finally:
        writer.close()
        reader.close()
        owner.unlink()


def test_a_reader_of_a_write_whose_writer_died_falls_back_to_the_newest_complete_snapshot():
    """A writer that dies mid-write leaves seq odd: a follower sees no progress for stall_s and reads the
    newest complete snapshot instead (asked for the dead version: None). The next writer skips past the
    dead write, and its snapshot is read whole."""
    n = 1024
    owner = Region.create(_name(), 2**20)
    writer, reader = Region.attach(owner.name), Region.attach(owner.name)
    dest = {f"w{i}": torch.zeros(n) for i in range(TENSORS)}
    try:
        writer.write(*_uniform(1, n))
        dead = writer.write_steps(*_uniform(2, n), chunk=1024)
        next(dead), next(dead), next(dead)
        del dead  # its writer is gone: w0 half written
        assert reader.writing() == 2
        sink = _Into(dest)
        assert reader.read_into(sink, stall_s=0.05) == 1 and reader.followed == 0
        assert sink.log[0] == ("begin", 2) and ("begin", 1) in sink.log  # it followed v2, then gave up on it
        assert all(torch.all(d == 1) for d in dest.values())
        assert reader.read_into(_Into(dest), version=2, stall_s=0.05) is None
        writer.write(*_uniform(3, n))
        assert reader.writing() == -1 and reader.versions() == (3, 1)
        assert reader.read_into(_Into(dest)) == 3 and all(torch.all(d == 3) for d in dest.values())
    finally:
        writer.close()
        reader.close()
        owner.unlink()


def test_a_destination_that_does_not_fit_its_array_is_refused():
    owner = Region.create(_name(), 2**20)
    try:
        owner.write(*_uniform(1, 64))
        dest = {f"w{i}": torch.zeros(64) for i in range(TENSORS)}
        with pytest.raises(ValueError, match=r"destination for 'w1' holds 128 bytes, the snapshot's array 256"):
            owner.read_into(_Into({**dest, "w1": torch.zeros(32)}))
        with pytest.raises(ValueError, match=r"destination for 'w0' is not contiguous"):
            owner.read_into(_Into({**dest, "w0": torch.zeros(128)[::2]}))
        assert owner.torn == 0  # refused, not mistaken for a torn read
    finally:
        owner.unlink()


STRESS_READERS, STRESS_VERSIONS = 3, 12  # each reader must accept this many distinct versions


def _continuous_writer(name: str, seen, done, cap: int) -> None:
    """Publishes uniform snapshots back to back until every reader has accepted enough distinct versions."""
    region = Region.attach(name)
    version = 0
    while version < cap and min(seen) < STRESS_VERSIONS:
        version += 1
        region.write(*_uniform(version, ELEMENTS), chunk=2**16)
    done.set()
    region.close()


class _Checking(_Into):
    """A slower follower: it also reads every array back out of the region as it arrives."""

    def arrived(self, key: str, view: np.ndarray) -> None:
        self.log.append(bool(np.all(view == view[0])))


def _follower(name: str, index: int, seen, done, results) -> None:
    region = Region.attach(name)
    dest = {f"w{i}": torch.zeros(ELEMENTS) for i in range(TENSORS)}
    sink = (_Checking if index == 0 else _Into)(dest)
    versions: set[int] = set()
    accepted = torn_used = regressions = newest = 0
    while not done.is_set():
        held = region.read_into(sink)
        sink.log.clear()
        if held is None:
            continue
        accepted += 1
        torn_used += not all(bool(torch.all(d == held)) for d in dest.values())
        regressions += held < newest
        newest = max(newest, held)
        versions.add(held)
        seen[index] = len(versions)
    results.put({"reader": index, "accepted": accepted, "torn_used": torn_used, "regressions": regressions,
                 "versions": len(versions), "torn_retried": region.torn, "followed": region.followed})
    region.close()


def test_pipelined_readers_of_a_continuous_writer_never_accept_a_torn_snapshot():
    """A writer process publishes snapshots whose every element is their version, back to back, in 64 KiB
    chunks; 3 reader processes follow the writes (one of them slower) and stream each into their own
    tensors. Every accepted snapshot is uniform and equal to its version, versions never go back, every
    reader accepted at least 10 distinct versions, and reads did follow writes in progress."""
    ctx = multiprocessing.get_context("spawn")
    owner = Region.create(_name(), TENSORS * ELEMENTS * 4 + 2**16)
    seen, done, results = ctx.Array("i", STRESS_READERS), ctx.Event(), ctx.Queue()
    try:
        owner.write(*_uniform(0, ELEMENTS))
        readers = [ctx.Process(target=_follower, args=(owner.name, i, seen, done, results))
                   for i in range(STRESS_READERS)]
        for proc in readers:
            proc.start()
        writer = ctx.Process(target=_continuous_writer, args=(owner.name, seen, done, 5000))
        writer.start()
        counts = [results.get(timeout=120) for _ in readers]
        writer.join(60)
        for proc in readers:
            proc.join(60)
        assert writer.exitcode == 0 and all(proc.exitcode == 0 for proc in readers)
    finally:
        done.set()
        owner.unlink()
    print(f"pipelined shm stress: {sorted(counts, key=lambda c: c['reader'])}")
    assert sum(c["torn_used"] for c in counts) == 0 and sum(c["regressions"] for c in counts) == 0, counts
    assert all(c["versions"] >= 10 for c in counts), counts
    assert sum(c["followed"] for c in counts) > 0, counts


# -- through the services, on a real local Ray ------------------------------------------------------

class Engine:
    """A stand-in ExploreEngine: copies each loaded state into preallocated tensors, like the real one."""

    def __init__(self, n: int = ELEMENTS) -> None:
        self.weights = {f"w{i}": torch.zeros(n) for i in range(TENSORS)}
        self.loads: list[int] = []  # how many tensors each load copied (0: streamed in, quantizers refreshed)

    def load(self, state, strict: bool = True, prequantized=()) -> None:
        self.loads.append(len(state))
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
    """An actor publishes 60 versions back to back into the region; two subscribers poll meanwhile, one
    streaming each snapshot straight into its engine's tensors (given as its targets), the other decoding it
    whole and loading it through `engine.load`. Each load the subscriber returned holds exactly the version
    it claims (torn reads are retried, counted)."""
    tag = "torn" + uuid.uuid4().hex[:6]
    services = start_services(keep=2, tag=tag)
    service = next(iter(services.values()))
    source = ray.remote(max_concurrency=2, num_cpus=0)(Source).remote(services)
    ray.get(source.publish.remote(0, 0))
    first, last = 1, 60
    errors: list[str] = []
    seen: list[set[int]] = [set(), set()]
    torn, followed, loads = [0, 0], [0, 0], [[], []]
    done = threading.Event()

    def reader(index: int) -> None:
        engine = Engine()
        subscriber = WeightSubscriber(service, engine, targets=engine.weights if index == 0 else None)
        while not done.is_set():
            info = subscriber.poll()
            if info is None:
                continue
            if not subscriber.engine.holds(info["version"]):
                errors.append(f"v{info['version']}: the engine holds a mixed snapshot")
            seen[index].add(info["version"])
        torn[index], followed[index], loads[index] = subscriber.torn, subscriber.followed, engine.loads

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
    print(f"shm service stress: versions seen {[len(s) for s in seen]}, torn reads retried {torn}, reads that "
          f"followed a write {followed}")
    assert not errors, errors[:3]
    assert set(loads[0]) == {0} and set(loads[1]) == {TENSORS}  # streamed into the targets; decoded, then loaded
    # reads overlapped the publishing (how many versions a reader catches depends on the machine's load: 3 to 60)
    assert all(len(s) >= 2 for s in seen), [len(s) for s in seen]
    assert all(max(s) == last for s in seen)


@pytest.mark.ray
def test_the_service_points_readers_at_the_version_being_written(local_ray):
    """While v2 is being written, `latest` and `get(2)` answer its marker (the reader follows the write);
    `version()` and the newest `get` reports count complete snapshots only."""
    service = WeightSyncService(keep=2, tag="writing" + uuid.uuid4().hex[:6])
    try:
        name = service.region(2**16)
        writer = Region.attach(name)
        writer.write(*_uniform(1, 64))
        steps = writer.write_steps(*_uniform(2, 64))
        next(steps)
        assert service.latest(-1) == (2, {"shm": name, "version": 2}, [])
        assert service.get(2) == (1, {"shm": name, "version": 2}, [])
        assert service.get(1) == (1, {"shm": name, "version": 1}, [])
        assert service.version() == 1 and service.get(3) == (1, None, [])
        for _ in steps:
            pass
        assert service.latest(1) == (2, {"shm": name, "version": 2}, []) and service.version() == 2
        assert service.latest(2) == (2, None, [])
        writer.close()
    finally:
        service.stop()


@pytest.mark.ray
def test_a_snapshot_corrupted_in_the_region_is_refused_by_its_checksum(local_ray):
    """A byte flipped in the region after the write (no writer overtook the read) fails the entry's CRC-32
    as the snapshot streams into the engine: CorruptSnapshot is raised, not retried, and the subscriber
    holds no version, since its engine's tensors were partly rewritten."""
    tag = "crc" + uuid.uuid4().hex[:6]
    services = start_services(keep=2, tag=tag)
    (_, service), = services.items()
    publisher = WeightPublisher(services, "dense", checksums=True)
    engine = Engine(64)
    subscriber = WeightSubscriber(service, engine, targets=engine.weights)
    try:
        publisher.publish(_snapshot(1, 64), 1)
        assert subscriber.poll()["version"] == 1 and engine.holds(1) and engine.loads == [0]
        publisher.publish(_snapshot(2, 64), 2)
        region = Region.attach(ray.get(service.latest.remote(-1))[1]["shm"])
        raw = np.frombuffer(region.shm.buf, np.uint8)  # a writable view of the whole region
        start = raw.ctypes.data
        where = region.read(lambda m, a: a["w2"].ctypes.data - start)[1]
        raw[where + 5] ^= 0xFF
        with pytest.raises(CorruptSnapshot, match=r"v2: checksum mismatch for 'w2'"):
            subscriber.poll()
        assert subscriber.version == -1 and subscriber.torn == 0
        raw[where + 5] ^= 0xFF
        del raw
        region.close()
        assert subscriber.poll()["version"] == 2 and engine.holds(2)
    finally:
        stop_services(services)


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
