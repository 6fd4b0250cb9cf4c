"""Node-local weight sync through POSIX shared memory: one write by the learner, zero-copy maps in readers.

Precedent: torchforge keeps versioned weights in POSIX shared memory for co-located readers;
checkpoint-engine, slime and verl move full weights GPU to GPU (CUDA IPC on a node, NCCL broadcast
between nodes) — planned here in `weight_sync.planned_gpu_path`, not wired in. The Ray object store stays
the path between nodes.

Region layout (one per node and job, created and unlinked by the node's WeightSyncService):

    header (4 KiB): int64 words — magic, seq, active slot, closed flag, slot capacity,
                    per slot: version, manifest bytes, payload bytes
    slot 0, slot 1: manifest JSON (array offsets, shapes, dtypes), then each array 64-byte aligned

Size: `region_bytes(n)` for snapshots of n bytes (`slot_bytes`): the header and two slots of n + n/8 each
(`slot_capacity`). /dev/shm is a tmpfs that hands out pages only when they are written, so a region larger
than its free space would be made and then kill its writer with SIGBUS: `region_shortfall` (the service, and
the preflight) compares the size with the free space first, and `Region.create` reserves every page
(posix_fallocate), which fails with ENOSPC instead.

Protocol — a seqlock over two slots, one writer at a time (the learner):

    writer: seq ← base+1 (odd) · write the inactive slot · set its header words · active ← it · seq ← base+2
    reader: s1 ← seq · read slot (active, or the other one for an older version) · s2 ← seq
            accept iff the slot cannot have been rewritten meanwhile, else retry

The active slot is rewritten by the second publish after the one that made it active, so a reader of
the active slot accepts iff s2 − even(s1) ≤ 2; a reader of the inactive slot iff s1 is even and
s2 = s1 (the very next publish rewrites it). Without the check readers do get torn snapshots; the
stress test in tests/weight_sync/test_shm.py counts the overtaken reads it retries (docs/benchmarks.md,
"Weight sync and the cluster", has the counts).
Readers *consume* the mapped arrays (decode, copy into the engine) before the check, then accept or
redo, so nothing torn is ever used: the engine is only trusted after an accepted read.

Header words are aligned 8-byte stores (atomic on x86-64 and aarch64). Ordering relies on the CPU not
reordering loads with loads nor stores with stores (x86-TSO); on weakly ordered CPUs (aarch64) keep
the manifest's CRC-32 checksums on (WeightPublisher(checksums=True)) as a second guard.

Python's `multiprocessing.shared_memory` registers every segment it opens with a resource tracker
that unlinks it when that process exits (Python < 3.13 has no `track=False`). That is wrong for writers
and readers, whose exit would delete the service's region: `attach` unregisters them. For the owner it
is not enough: when Ray kills a service, its tracker did not unlink the region (tested), so the service
also starts a detached `Watchdog` that does.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from multiprocessing import resource_tracker, shared_memory
from typing import Any, TypeVar

import numpy as np

MAGIC = 0x534F4C52_4C575331  # "SOLRLWS1"
HEADER = 4096
ALIGN = 64
PREFIX = "solrl_ws_"
SHM_FOLDER = "/dev/shm"  # where Linux keeps POSIX shared memory (a tmpfs): the regions' room
_MAGIC, _SEQ, _ACTIVE, _CLOSED, _CAPACITY = range(5)
_VERSION, _MANIFEST, _PAYLOAD = 8, 10, 12  # + slot index

T = TypeVar("T")


class TornRead(RuntimeError):
    """A read the writer overtook; retried by `read`, raised only when every retry was overtaken."""


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


class Region:
    """A mapped two-slot region. `Region.create` (the service: owner, tracked, unlinks) or
    `Region.attach` (writers and readers: untracked, never unlink)."""

    def __init__(self, shm: shared_memory.SharedMemory, owner: bool) -> None:
        self.shm, self.owner, self.name = shm, owner, shm.name
        self.header = np.ndarray((64,), dtype=np.int64, buffer=shm.buf)
        self.capacity = int(self.header[_CAPACITY])
        self.torn = 0  # reads this process retried because the writer overtook them

    @classmethod
    def create(cls, name: str, capacity: int) -> Region:
        """A new region of two slots of `capacity` bytes (in whole pages), its pages reserved up front:
        OSError (ENOSPC) here when /dev/shm cannot hold it, rather than SIGBUS in a writer later."""
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
        header[_VERSION], header[_VERSION + 1] = -1, -1
        header[_CAPACITY] = capacity
        header[_MAGIC] = MAGIC
        del header
        return cls(shm, owner=True)

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
        """(newest, other slot's) versions; -1 where none."""
        active = int(self.header[_ACTIVE])
        return int(self.header[_VERSION + active]), int(self.header[_VERSION + 1 - active])

    def _slot(self, index: int) -> int:
        return HEADER + index * self.capacity

    # -- writer -----------------------------------------------------------------------------------
    def write(self, manifest: dict, arrays: Mapping[str, np.ndarray]) -> int:
        """Write a snapshot into the inactive slot and make it active; the bytes written. A version not
        newer than the newest held is ignored (0 bytes): versions only increase, retries are idempotent."""
        if int(manifest["version"]) <= self.versions()[0]:
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
        base = seq + (seq & 1)  # an odd seq: a writer died mid-write; its slot was never made active
        target = 1 - int(header[_ACTIVE])
        header[_SEQ] = base + 1
        slot = self._slot(target)
        buf = self.shm.buf
        buf[slot:slot + len(meta)] = meta
        data = slot + start
        for key, array in arrays.items():
            src = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
            dst = np.ndarray(src.shape, np.uint8, buffer=buf, offset=data + layout[key][0])
            _copy(dst, src)
        header[_VERSION + target] = int(manifest["version"])
        header[_MANIFEST + target] = len(meta)
        header[_PAYLOAD + target] = offset
        header[_ACTIVE] = target
        header[_SEQ] = base + 2
        return start + offset

    # -- reader -----------------------------------------------------------------------------------
    def read(self, consume: Callable[[dict, dict[str, np.ndarray]], T], version: int | None = None,
             retries: int = 100) -> tuple[int, T] | None:
        """`consume(manifest_json, arrays)` over the mapped, read-only arrays of the newest snapshot (or
        of `version`; None if no slot holds it), accepted only if the writer did not overtake it — else
        retried. Arrays are views into the region: consume must copy what it keeps."""
        header = self.header
        for _ in range(retries):
            s1 = int(header[_SEQ])
            active = int(header[_ACTIVE])
            if version is None or int(header[_VERSION + active]) == version:
                slot, limit = active, (s1 & ~1) + 2
            elif int(header[_VERSION + 1 - active]) == version:
                if s1 & 1:
                    return None  # being rewritten now
                slot, limit = 1 - active, s1
            else:
                return None
            held = int(header[_VERSION + slot])
            if held < 0:
                return None
            try:
                result = self._consume(slot, consume)
            except Exception:
                if int(header[_SEQ]) <= limit:
                    raise  # not torn: a real error
                result = None
            if int(header[_SEQ]) <= limit and int(header[_VERSION + slot]) == held:
                return held, result  # type: ignore[return-value]
            self.torn += 1
            time.sleep(0)
        raise TornRead(f"{retries} reads of region {self.name} in a row were overtaken by the writer")

    def _consume(self, slot: int, consume: Callable[[dict, dict[str, np.ndarray]], T]) -> T:
        base = self._slot(slot)
        length = int(self.header[_MANIFEST + slot])
        if not 0 < length <= self.capacity:
            raise TornRead("manifest length out of range")
        meta = json.loads(bytes(self.shm.buf[base:base + length]))
        data = base + _align(length)
        arrays = {}
        for key, (offset, shape, dtype) in meta["layout"].items():
            array = np.ndarray(tuple(shape), np.dtype(dtype), buffer=self.shm.buf, offset=data + offset)
            array.flags.writeable = False
            arrays[key] = array
        try:
            return consume(meta["manifest"], arrays)
        finally:
            del arrays

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


def _copy(dst: np.ndarray, src: np.ndarray) -> None:
    """Large copies through torch: its copy runs on several threads (numpy's on one)."""
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only sources: torch only reads them
        torch.from_numpy(dst).copy_(torch.from_numpy(src))


def describe(region: Region | None) -> dict[str, Any]:
    if region is None:
        return {}
    newest, other = region.versions()
    return {"region": region.name, "capacity": region.capacity, "versions": [newest, other]}
