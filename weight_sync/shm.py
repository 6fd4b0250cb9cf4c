"""Node-local weight sync through POSIX shared memory: one write by the learner, readers that follow it.

Precedent: torchforge keeps versioned weights in POSIX shared memory for co-located readers;
checkpoint-engine, slime and verl move full weights GPU to GPU (CUDA IPC on a node, NCCL broadcast
between nodes) — planned here in `weight_sync.planned_gpu_path`, not wired in. The Ray object store stays
the path between nodes.

Region layout (one per node and job, created and unlinked by the node's WeightSyncService):

    header (4 KiB): int64 words — magic, seq, active slot, closed flag, slot capacity, slot being written,
                    version being written; per slot: version, manifest bytes, payload bytes, progress
    slot 0, slot 1: manifest JSON (array offsets, shapes, dtypes), then each array 64-byte aligned

Size: `region_bytes(n)` for snapshots of n bytes (`slot_bytes`): the header and two slots of n + n/8 each
(`slot_capacity`). /dev/shm is a tmpfs that hands out pages only when they are written, so a region larger
than its free space would be made and then kill its writer with SIGBUS: `region_shortfall` (the service, and
the preflight) compares the size with the free space first, and `Region.create` reserves every page
(posix_fallocate), which fails with ENOSPC instead.

Protocol — a seqlock over two slots, one writer at a time (the learner), pipelined by a per-slot progress
word so that a reader copies chunk k while the writer fills chunk k+1:

    writer: progress[T] ← 0 · writing ← (T, v) · seq ← base+1 (odd)   (T: the inactive slot)
            manifest · progress[T] ← its end · per chunk: copy it · progress[T] ← its end
            version[T] ← v · active ← T · seq ← base+2
    reader: s1 ← seq · pick a slot and its limit (below) · per array: wait until progress covers
            it, copy it (into the caller's destination, or hand the mapped view over) · s2 ← seq
            accept iff s2 ≤ limit (the slot cannot have been rewritten meanwhile), else retry

A slot is rewritten only by the second write after the one that filled it, so the limits are: following
the write in progress (s1 odd, slot T): s1 + 3 (that write ends at s1 + 1, the next one fills the other
slot, the one after that starts at s1 + 4 on T); the active slot: even(s1) + 2; the inactive slot (an
older version, s1 even): s1 (the very next write rewrites it). Every progress word a reader uses is
checked against seq right after it is loaded: progress belongs to the write of seq s1 while seq still
reads s1 (progress[T] is reset before seq turns odd, so no older write's count survives into s1), and
once seq has moved on but not past the limit, that write is finished and every byte of it is in place.
Without the check readers do get torn snapshots; the stress tests in tests/weight_sync/test_shm.py count
the overtaken reads they retry (docs/benchmarks.md, "Weight sync and the cluster", has the counts).
Readers *consume* what they read (copy into the engine, decode) before the final check, then accept or
redo, so nothing torn is ever used: the engine is only trusted after an accepted read, and a retry
overwrites every destination.

Memory ordering: header words are aligned 8-byte stores (atomic on x86-64 and aarch64). The writer
stores a chunk's bytes, then its progress; the reader loads progress, then the bytes — correct when
stores are not reordered with stores nor loads with loads (x86-TSO), and each copy has returned (its
threads joined, glibc's non-temporal stores fenced) before the next header store. `_fence` adds an
atomic read-modify-write between them (a full barrier on x86-64, where it also drains non-temporal
stores); Python has no portable fence, so on weakly ordered CPUs (aarch64) keep the manifest's CRC-32
checksums on (WeightPublisher(checksums=True)) as a second guard.

Python's `multiprocessing.shared_memory` registers every segment it opens with a resource tracker
that unlinks it when that process exits (Python < 3.13 has no `track=False`). That is wrong for writers
and readers, whose exit would delete the service's region: `attach` unregisters them. For the owner it
is not enough: when Ray kills a service, its tracker did not unlink the region (tested), so the service
also starts a detached `Watchdog` that does.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Generator, Mapping
from multiprocessing import resource_tracker, shared_memory
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np

if TYPE_CHECKING:
    import torch

MAGIC = 0x534F4C52_4C575332  # "SOLRLWS2": the pipelined layout (a region of the unpipelined one reads as foreign)
HEADER = 4096
ALIGN = 64
PREFIX = "solrl_ws_"
SHM_FOLDER = "/dev/shm"  # where Linux keeps POSIX shared memory (a tmpfs): the regions' room
CHUNK = 4 * 2**20  # the writer publishes its progress every CHUNK bytes: how far a follower trails it
_MAGIC, _SEQ, _ACTIVE, _CLOSED, _CAPACITY, _WSLOT, _WVERSION = range(7)
_VERSION, _MANIFEST, _PAYLOAD, _PROGRESS = 8, 10, 12, 14  # + slot index

T = TypeVar("T")


class TornRead(RuntimeError):
    """A read the writer overtook; retried by `read`/`read_into`, raised only when every retry was overtaken."""


class _Overtaken(Exception):
    """Raised inside a read as soon as seq has passed the read's limit: the slot is being rewritten."""


class _Stalled(Exception):
    """Raised inside a read that follows a write whose progress stood still for `stall_s` (a dead writer)."""


class Sink(Protocol):
    """Where `Region.read_into` puts a snapshot, array by array, in the order the writer wrote them.

    begin(manifest, layout) is called once the manifest is in place (`layout`: each array's shape and
    dtype) and answers destinations by key: a writable, contiguous numpy array or torch tensor (any
    device) of exactly that array's bytes, into which the region copies it chunk by chunk as the writer
    publishes them; keys without one are only waited for. arrived(key, view) follows once the whole array
    is in place (and copied), with a read-only view of it in the region; end() after the last one. All of
    this runs before the read is accepted: a read found overtaken afterwards starts again with begin, and
    its destinations get every byte again. The views are valid only until the call returns.
    """

    def begin(self, manifest: dict, layout: dict[str, tuple[tuple[int, ...], np.dtype]]) -> Mapping[str, Any]: ...

    def arrived(self, key: str, view: np.ndarray) -> None: ...

    def end(self) -> None: ...


def region_prefix(tag: str, node_id: str) -> str:
    return f"{PREFIX}{tag or 'default'}_{node_id[:12]}_"


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _shm_names() -> list[str]:
    """Names of this host's POSIX shared-memory segments (Linux exposes them as files)."""
    return sorted(os.listdir(SHM_FOLDER)) if os.path.isdir(SHM_FOLDER) else []


# ---- how big a region is, and whether it fits --------------------------------------------------------
def slot_bytes(payload: int, arrays: int, manifest: int) -> int:
    """At most what one snapshot takes in a slot: `payload` bytes in `arrays` arrays (each 64-byte aligned)
    after its layout JSON (the manifest's `manifest` characters, at most doubled by the arrays' offsets)."""
    return payload + ALIGN * arrays + 2 * manifest + 2**16


def slot_capacity(nbytes: int) -> int:
    """The capacity a region's slot gets for snapshots of `nbytes`: an eighth more, so that a snapshot a
    little larger does not replace the region, in whole pages."""
    return -(-(nbytes + nbytes // 8 + 2**16) // 4096) * 4096


def region_bytes(nbytes: int) -> int:
    """The size in /dev/shm of the region made for snapshots of `nbytes`: the header and two slots."""
    return HEADER + 2 * slot_capacity(nbytes)


def shm_free_bytes(folder: str = SHM_FOLDER) -> int | None:
    """Bytes free in `folder` for an unprivileged writer (statvfs); None where there is no such folder."""
    try:
        stats = os.statvfs(folder)
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


def size_text(n: int) -> str:
    """Bytes as the largest unit that keeps one digit before the point (MiB, GiB: what tmpfs sizes are in)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def region_shortfall(nbytes: int, free: int | None) -> str | None:
    """Why a region for snapshots of `nbytes` cannot be made when `free` bytes of /dev/shm are free; None
    when it fits (or nobody knows: `free` None). Writing past a full /dev/shm kills the writer with SIGBUS,
    so this is decided before the region is made."""
    need = region_bytes(nbytes)
    if free is None or need <= free:
        return None
    return (f"{SHM_FOLDER} has {size_text(free)} free, the weight-sync region needs {size_text(need)} (2 slots for "
            f"snapshots of {size_text(nbytes)}): snapshots go through Ray's object store instead (slower); to use "
            f"shared memory give {SHM_FOLDER} {size_text(need - free)} more room (docker run "
            f"--shm-size={-(-need // 2**30)}g or more; else mount -o remount,size=<larger> {SHM_FOLDER})")


_OWNED: set[str] = set()  # regions this process created: attaching to them must keep them tracked


def _untrack(shm: shared_memory.SharedMemory) -> None:
    if sys.version_info < (3, 13) and shm.name not in _OWNED:
        resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]


def remove_stale(tag: str, node_id: str, keep: str = "") -> list[str]:
    """Close and unlink this job's regions on this node (a dead predecessor's) except `keep`; their names.
    Closing first tells a writer or reader still mapping one to ask the service for the new name."""
    removed = []
    for name in _shm_names():
        if not name.startswith(region_prefix(tag, node_id)) or name == keep:
            continue
        try:
            shm = shared_memory.SharedMemory(name)
        except FileNotFoundError:
            continue
        _untrack(shm)
        if shm.size >= HEADER:
            header = np.ndarray((64,), dtype=np.int64, buffer=shm.buf)
            if header[_MAGIC] == MAGIC:
                header[_CLOSED] = 1
            del header
        shm.close()
        with contextlib.suppress(FileNotFoundError):
            shm.unlink()
        removed.append(name)
    return removed


_WATCHDOG = """
import os, sys
if os.fork():
    os._exit(0)  # the launcher exits: the watchdog is nobody's child, so killing the owner's children spares it
import _posixshmem
names = set()
for line in sys.stdin:
    (names.add if line[0] == "+" else names.discard)(line[1:].strip())
for name in names:
    try:
        _posixshmem.shm_unlink("/" + name)
    except OSError:
        pass
"""


class Watchdog:
    """Unlinks the owner's regions when the owner process dies, however it dies.

    The resource tracker is meant to do this, but it is the owner's child and did not (a killed
    service's region stayed, most likely because Ray ends a worker's child processes with it). The
    watchdog is a detached process that holds the read end of a pipe; the kernel closes the write end
    when the owner dies, and on EOF it unlinks the names it was told about ("+name" created, "-name"
    already unlinked)."""

    def __init__(self) -> None:
        import subprocess

        self._proc = subprocess.Popen([sys.executable, "-c", _WATCHDOG], stdin=subprocess.PIPE,
                                      start_new_session=True, close_fds=True)
        self._pipe = self._proc.stdin
        self._proc.wait()  # the launcher; its detached child keeps the pipe

    def tell(self, op: str, name: str) -> None:
        try:
            self._pipe.write(f"{op}{name}\n".encode())  # type: ignore[union-attr]
            self._pipe.flush()  # type: ignore[union-attr]
        except (BrokenPipeError, ValueError):
            pass

    def close(self) -> None:
        with contextlib.suppress(BrokenPipeError):
            self._pipe.close()  # type: ignore[union-attr]


def leaked(tag: str = "") -> list[str]:
    """This tag's (every tag's if empty) regions still present on this host."""
    prefix = f"{PREFIX}{tag}_" if tag else PREFIX
    return [n for n in _shm_names() if n.startswith(prefix)]


def formatted_memory(name: str, capacity: int) -> shared_memory.SharedMemory:
    """New shared memory for a region of two slots of `capacity` bytes (in whole pages), its header written
    (no versions, the capacity, the magic) and its pages reserved up front: OSError (ENOSPC) here when
    /dev/shm cannot hold it, rather than SIGBUS in a writer later. Tracked as this process's to unlink."""
    capacity = -(-capacity // 4096) * 4096
    shm = shared_memory.SharedMemory(name, create=True, size=HEADER + 2 * capacity)
    if hasattr(os, "posix_fallocate"):  # Linux; tmpfs gives a size without pages until they are written
        try:
            os.posix_fallocate(shm._fd, 0, shm.size)  # type: ignore[attr-defined]
        except OSError:
            shm.close()
            shm.unlink()  # (and unregisters it from the resource tracker)
            raise
    _OWNED.add(shm.name)
    header = np.ndarray((64,), dtype=np.int64, buffer=shm.buf)
    header[:] = 0
    header[_VERSION], header[_VERSION + 1], header[_WVERSION] = -1, -1, -1
    header[_CAPACITY] = capacity
    header[_MAGIC] = MAGIC
    del header  # a view into shm.buf would keep it from closing
    return shm


class Region:
    """A mapped two-slot region. `Region.create` (the service: owner, tracked, unlinks) or
    `Region.attach` (writers and readers: untracked, never unlink)."""

    def __init__(self, shm: shared_memory.SharedMemory, owner: bool) -> None:
        self.shm, self.owner, self.name = shm, owner, shm.name
        self.header = np.ndarray((64,), dtype=np.int64, buffer=shm.buf)
        self.capacity = int(self.header[_CAPACITY])
        self.torn = 0  # reads this process retried because the writer overtook them
        self.followed = 0  # accepted reads that began while their version was still being written

    @classmethod
    def create(cls, name: str, capacity: int) -> Region:
        """A new region of two slots of `capacity` bytes (`formatted_memory`), owned by this process."""
        return cls(formatted_memory(name, capacity), owner=True)

    @classmethod
    def attach(cls, name: str) -> Region:
        shm = shared_memory.SharedMemory(name)
        _untrack(shm)
        region = cls(shm, owner=False)
        if region.header[_MAGIC] != MAGIC:
            region.close()
            raise ValueError(f"shared memory {name!r} is not a weight-sync region")
        return region

    @property
    def closed(self) -> bool:
        return bool(self.header[_CLOSED])

    def versions(self) -> tuple[int, int]:
        """(newest, other slot's) versions of the complete snapshots; -1 where none."""
        active = int(self.header[_ACTIVE])
        return int(self.header[_VERSION + active]), int(self.header[_VERSION + 1 - active])

    def writing(self) -> int:
        """The version being written now (readers can follow it: `read_into`); -1 when no write is."""
        header = self.header
        seq = int(header[_SEQ])
        version = int(header[_WVERSION])
        return version if seq & 1 and int(header[_SEQ]) == seq else -1

    def _slot(self, index: int) -> int:
        return HEADER + index * self.capacity

    # -- writer -----------------------------------------------------------------------------------
    def write(self, manifest: dict, arrays: Mapping[str, np.ndarray], chunk: int = CHUNK) -> int:
        """Write a snapshot into the inactive slot and make it active; the bytes written. A version not
        newer than the newest held is ignored (0 bytes): versions only increase, retries are idempotent.
        Progress is published every `chunk` bytes, so readers copy what is written while the rest is."""
        steps = self.write_steps(manifest, arrays, chunk)
        while True:
            try:
                next(steps)
            except StopIteration as stop:
                return int(stop.value)

    def write_steps(self, manifest: dict, arrays: Mapping[str, np.ndarray],
                    chunk: int = CHUNK) -> Generator[int, None, int]:
        """`write`, one step per published progress (the manifest, then each chunk): each step yields the
        slot's bytes in place so far; the generator's value is what `write` answers. Stepping it by hand
        lets a test put a reader at an exact point of a write; a generator dropped halfway is a writer
        that died mid-write (the next write skips past it)."""
        version = int(manifest["version"])
        if version <= self.versions()[0]:
            return 0
        layout, offset = {}, 0
        for key, array in arrays.items():
            layout[key] = [offset, list(array.shape), array.dtype.str]
            offset = _align(offset + array.nbytes)
        meta = json.dumps({"manifest": manifest, "layout": layout}).encode()
        start = _align(len(meta))
        if start + offset > self.capacity:
            raise ValueError(f"snapshot of {start + offset} bytes exceeds the slot capacity {self.capacity}")
        header = self.header
        seq = int(header[_SEQ])
        # An odd seq: a writer died mid-write into the inactive slot, which this write fills again; it starts
        # at seq + 4, past the limit (seq + 3) of any reader still following the dead write.
        base = seq + 3 if seq & 1 else seq
        target = 1 - int(header[_ACTIVE])
        header[_PROGRESS + target] = 0  # before seq turns odd: no count of an older write survives into it
        header[_WSLOT] = target
        header[_WVERSION] = version
        _fence()
        header[_SEQ] = base + 1
        _fence()
        slot = self._slot(target)
        buf = self.shm.buf
        buf[slot:slot + len(meta)] = meta
        header[_MANIFEST + target] = len(meta)
        header[_PAYLOAD + target] = offset
        _fence()
        header[_PROGRESS + target] = start
        yield start
        for key, array in arrays.items():
            src = _bytes(np.ascontiguousarray(array))
            at = start + layout[key][0]
            dst = _bytes(np.ndarray((array.nbytes,), np.uint8, buffer=buf, offset=slot + at))
            for a in range(0, array.nbytes, chunk):
                b = min(array.nbytes, a + chunk)
                dst[a:b].copy_(src[a:b])
                _fence()  # the chunk's bytes before the progress that announces them
                header[_PROGRESS + target] = at + b
                yield at + b
        header[_VERSION + target] = version
        header[_ACTIVE] = target
        _fence()
        header[_SEQ] = base + 2
        return start + offset

    # -- reader -----------------------------------------------------------------------------------
    def read(self, consume: Callable[[dict, dict[str, np.ndarray]], T], version: int | None = None,
             retries: int = 100, stall_s: float = 10.0) -> tuple[int, T] | None:
        """`consume(manifest_json, arrays)` over the mapped, read-only arrays of the newest snapshot (or
        of `version`; None if no slot holds it and it is not being written), once every array is in place,
        accepted only if the writer did not overtake it — else retried. Arrays are views into the region:
        consume must copy what it keeps. A snapshot being written is followed (`read_into`)."""
        sink = _Collect(consume)
        held = self.read_into(sink, version, retries=retries, stall_s=stall_s)
        return None if held is None else (held, sink.result)

    def read_into(self, sink: Sink, version: int | None = None, retries: int = 100,
                  stall_s: float = 10.0) -> int | None:
        """Stream the newest snapshot (or `version`) into `sink` (see `Sink`); the version accepted, or
        None when no slot holds that version and it is not being written. A snapshot still being
        written is followed: each chunk is copied as soon as the writer has published it. When that
        write makes no progress for `stall_s` (its writer died), the read falls back to the newest
        complete snapshot (None if `version` asked for the stalled one). Overtaken reads are retried
        (`torn` counts them) and raise TornRead after `retries` in a row.

        None can come after a retry had already written into the destinations: a caller that gave
        destinations must treat them as undefined unless a version is returned."""
        header = self.header
        stalled = -1
        for _ in range(retries):
            found = self._locate(version, stalled)
            if found is None:
                return None
            s1, slot, limit, held, following = found
            try:
                self._stream(sink, s1, slot, limit, following, stall_s)
            except _Overtaken:
                pass
            except _Stalled:
                stalled = s1
                continue
            except Exception:
                if int(header[_SEQ]) <= limit:
                    raise  # not torn: a real error
            else:
                if int(header[_SEQ]) <= limit and (following or int(header[_VERSION + slot]) == held):
                    self.followed += following
                    return held
            self.torn += 1
            time.sleep(0)
        raise TornRead(f"{retries} reads of region {self.name} in a row were overtaken by the writer")

    def _locate(self, version: int | None, stalled: int) -> tuple[int, int, int, int, bool] | None:
        """(s1, slot, limit, version held, following) for reading `version` (None: the newest) now."""
        header = self.header
        while True:
            s1 = int(header[_SEQ])
            if s1 & 1:
                slot, writing = int(header[_WSLOT]), int(header[_WVERSION])
                if int(header[_SEQ]) != s1:
                    continue  # a write ended or began between the loads: look again
                if s1 != stalled and (version is None or version == writing):
                    return s1, slot, s1 + 3, writing, True
                done = 1 - slot  # the active slot, complete: rewritten by the write after this one
                held = int(header[_VERSION + done])
                if held < 0 or (version is not None and version != held):
                    return None
                return s1, done, s1 + 1, held, False
            active = int(header[_ACTIVE])
            newest, older = int(header[_VERSION + active]), int(header[_VERSION + 1 - active])
            if version is None or version == newest:
                slot, limit, held = active, s1 + 2, newest
            elif version == older:
                slot, limit, held = 1 - active, s1, older
            else:
                return None
            return None if held < 0 else (s1, slot, limit, held, False)

    def _stream(self, sink: Sink, s1: int, slot: int, limit: int, following: bool, stall_s: float) -> None:
        header, buf, base = self.header, self.shm.buf, self._slot(slot)
        last, since = -1, 0.0

        def ready(need: int) -> int:
            """The slot's bytes in place once at least `need` are (all: the capacity, once the write ended).
            Progress is loaded before seq: if seq still reads s1, the progress was this write's."""
            nonlocal last, since
            while True:
                progress = int(header[_PROGRESS + slot]) if following else self.capacity
                _fence()
                seq = int(header[_SEQ])
                if seq > limit:
                    raise _Overtaken
                if seq != s1 or progress >= need:
                    return self.capacity if seq != s1 else progress
                now = time.monotonic()
                if progress != last:
                    last, since = progress, now
                elif now - since > stall_s:
                    raise _Stalled
                time.sleep(0)  # yield the core: on a busy machine the writer may need it

        ready(1)  # the manifest (progress > 0)
        length = int(header[_MANIFEST + slot])
        if not 0 < length <= self.capacity:
            raise TornRead("manifest length out of range")
        meta = json.loads(bytes(buf[base:base + length]))
        data = _align(length)
        items = [(key, data + offset, tuple(shape), np.dtype(dtype))
                 for key, (offset, shape, dtype) in meta["layout"].items()]
        destinations = sink.begin(meta["manifest"], {key: (shape, dtype) for key, _, shape, dtype in items})
        for key, at, shape, dtype in items:
            nbytes = math.prod(shape) * dtype.itemsize
            view = np.ndarray(shape, dtype, buffer=buf, offset=base + at)
            view.flags.writeable = False
            target = destinations.get(key)
            if target is not None:
                dst, src = _bytes(target, nbytes, key), _bytes(view)
                done = 0
                while done < nbytes:
                    upto = min(nbytes, ready(at + done + 1) - at)
                    dst[done:upto].copy_(src[done:upto])
                    done = upto
            elif nbytes:
                ready(at + nbytes)
            sink.arrived(key, view)
            del view
        sink.end()

    # -- lifetime ---------------------------------------------------------------------------------
    def close(self) -> None:
        self.header = None  # type: ignore[assignment]
        with contextlib.suppress(BufferError):  # a view is still alive somewhere; the mapping goes with it
            self.shm.close()

    def unlink(self) -> None:
        """Owner only: mark closed (mappers re-ask the service), then remove the name."""
        if self.header is not None:
            self.header[_CLOSED] = 1
        self.close()
        _OWNED.discard(self.name)
        with contextlib.suppress(FileNotFoundError):
            self.shm.unlink()  # also unregisters it from this process's resource tracker


class _Collect:
    """The sink behind `Region.read`: no destinations; consume runs over the mapped views at the end."""

    def __init__(self, consume: Callable[[dict, dict[str, np.ndarray]], Any]) -> None:
        self.consume = consume
        self.result: Any = None
        self._manifest: dict = {}
        self._arrays: dict[str, np.ndarray] = {}

    def begin(self, manifest: dict, layout: dict) -> Mapping[str, Any]:
        self._manifest, self._arrays = manifest, {}
        return {}

    def arrived(self, key: str, view: np.ndarray) -> None:
        self._arrays[key] = view

    def end(self) -> None:
        try:
            self.result = self.consume(self._manifest, self._arrays)
        finally:
            self._arrays = {}  # the views must not outlive the read: the region cannot close under them


_BARRIER = threading.Lock()


def _fence() -> None:
    """An atomic read-modify-write (an uncontended lock taken and given back): on x86-64 a locked
    instruction, a full memory barrier; Python exposes no fence of its own (see the module's docstring)."""
    _BARRIER.acquire()
    _BARRIER.release()


def _bytes(array: np.ndarray | torch.Tensor, nbytes: int | None = None, key: str = "") -> torch.Tensor:
    """A flat uint8 tensor over `array`'s own memory (no copy): torch's copy_ moves the bytes (it runs on
    torch's threads where numpy's runs on one, and reaches tensors on any device). torch is imported here, by
    the processes that copy snapshots, so the node's service (which only makes regions) starts without it."""
    import torch

    if isinstance(array, np.ndarray):
        if not array.flags.c_contiguous:
            raise ValueError(f"destination for {key!r} is not contiguous")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read-only sources: torch only reads them
            flat = torch.from_numpy(array.reshape(-1).view(np.uint8))
    else:
        if not array.is_contiguous():
            raise ValueError(f"destination for {key!r} is not contiguous")
        flat = array.detach().reshape(-1).view(torch.uint8)
    if nbytes is not None and flat.numel() != nbytes:
        raise ValueError(f"destination for {key!r} holds {flat.numel()} bytes, the snapshot's array {nbytes}")
    return flat


def describe(region: Region | None) -> dict[str, Any]:
    if region is None:
        return {}
    newest, other = region.versions()
    return {"region": region.name, "capacity": region.capacity, "versions": [newest, other]}
