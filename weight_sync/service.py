"""The weight-sync service: one Ray actor per node holding the newest policy snapshots.

    publish(manifest, source=learner) → version   (the learner, once per update, to every node's service)
    latest(after) → (version, manifest, [ref])     (readers on the node; ray.get(ref) maps arrays zero-copy)

Ownership without an extra copy: the service *pulls* each snapshot by calling the learner's
`snapshot(version)`. In Ray the caller owns a task's return value, so the object — written once into
the object store by the learner's serializer — belongs to the service: a learner that crashes after
publishing loses nothing, and nobody copied the payload twice. (Ray ≥ 2.56 removed `ray.put(...,
_owner=...)`.) Publishers that are not actors pass the arrays instead, which costs one more copy.
Snapshots are immutable Ray objects, so a reader can never see a torn or mixed version; versions only
increase; all but the newest `keep` are released. The service is restartable (max_restarts=-1): a
restarted one is empty and answers version -1 until the learner republishes to it. It is a threaded
actor, so readers are served while a publish waits for its object.

On the learner's own node the snapshot skips the object store: the service owns a two-slot shared-memory
region (`weight_sync.shm`; `region(nbytes)` creates or grows it), the learner writes each snapshot into
it once, and readers map it and verify a sequence number after reading. `latest`/`get` then answer a
marker `{"shm": region name, "version": v}` instead of an object reference — also for the version the
learner is writing at that moment, so a reader follows the write chunk by chunk instead of waiting for
its end (`version()` and the `newest` of `get` count complete snapshots only). A region /dev/shm has no room
for (its free space is checked first, and the region's pages are reserved when it is made) is not made:
`region` warns, naming /dev/shm and the sizes, and answers None, and the learner sends that node's
snapshots through the object store like any other node's. The region is named after
the job's tag and the node; it is unlinked by `stop()`, by `__del__`, by a detached watchdog process if the
service process is killed (`weight_sync.shm.Watchdog`), and by a restarted service (stale regions of its
tag and node).
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
import warnings
from typing import Any

import numpy as np
import ray

from weight_sync.shm import (
    SHM_FOLDER,
    Region,
    Watchdog,
    describe,
    region_bytes,
    region_prefix,
    region_shortfall,
    remove_stale,
    shm_free_bytes,
    slot_capacity,
)


class WeightSyncService:
    def __init__(self, keep: int = 2, tag: str = "", shm_limit: int | None = None) -> None:
        """`shm_limit`: the most bytes of /dev/shm the region may take (None: as many as are free there)."""
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        if shm_limit is not None and shm_limit < 0:
            raise ValueError(f"shm_limit must be >= 0 bytes (or None: what /dev/shm has free), got {shm_limit}")
        self.keep = keep
        self.tag = tag
        self.shm_limit = shm_limit
        self.shm_unavailable: str | None = None  # why the region last asked for could not be made
        self.node = ray.get_runtime_context().get_node_id()
        self._snapshots: dict[int, tuple[dict, ray.ObjectRef]] = {}
        self._lock = threading.Lock()
        self._region: Region | None = None
        self._watchdog: Watchdog | None = None
        remove_stale(tag, self.node)  # a killed predecessor's region (its tracker may not have run yet)

    def __repr__(self) -> str:  # Ray's log prefix and the dashboard's name for it
        return service_name(getattr(self, "node", "starting"))

    # -- the shared-memory path (readers on this node) ---------------------------------------------
    def region(self, nbytes: int) -> str | None:
        """The name of this node's region, created or grown so a slot holds `nbytes` (plus headroom).
        Growing replaces it: the old one is marked closed and unlinked; mappers re-ask for the name.

        None when it cannot be made — /dev/shm (or `shm_limit`) has too little room, or creating it failed —
        after a warning naming /dev/shm and the sizes: the publisher then sends this node's snapshots
        through the object store, and readers get object references."""
        with self._lock:
            if self._region is None or self._region.closed or self._region.capacity < nbytes:
                problem = self._no_room(nbytes)
                name = f"{region_prefix(self.tag, self.node)}{uuid.uuid4().hex[:8]}"
                if problem is None:
                    try:
                        region = Region.create(name, slot_capacity(nbytes))
                    except OSError as exc:  # ENOSPC from reserving its pages, or no POSIX shm at all
                        problem = (f"creating the weight-sync region in {SHM_FOLDER} ({region_bytes(nbytes)} bytes) "
                                   f"failed ({exc}): snapshots go through Ray's object store instead (slower)")
                if problem is not None:
                    self.shm_unavailable = problem
                    warnings.warn(f"{service_name(self.node)}: {problem}", RuntimeWarning, stacklevel=2)
                    return None
                old, self._region, self.shm_unavailable = self._region, region, None
                if self._watchdog is None:
                    self._watchdog = Watchdog()
                self._watchdog.tell("+", name)
                if old is not None:
                    old.unlink()
                    self._watchdog.tell("-", old.name)
            return self._region.name

    def _no_room(self, nbytes: int) -> str | None:
        """Why a region for snapshots of `nbytes` does not fit (`region_shortfall`), counting `shm_limit`."""
        free = shm_free_bytes()
        if self.shm_limit is not None:
            free = self.shm_limit if free is None else min(free, self.shm_limit)
        return region_shortfall(nbytes, free)

    def _shm_versions(self) -> tuple[int, int]:
        return self._region.versions() if self._region is not None else (-1, -1)

    def _shm_writing(self) -> int:
        return self._region.writing() if self._region is not None else -1

    def _marker(self, version: int) -> dict:
        return {"shm": self._region.name, "version": version}  # type: ignore[union-attr]

    def stop(self) -> None:
        """Release everything: snapshots and the region (its name is unlinked; mappings stay valid)."""
        with self._lock:
            self._snapshots.clear()
            if self._region is not None:
                self._region.unlink()
                self._region = None
            if self._watchdog is not None:
                self._watchdog.close()
                self._watchdog = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            if self._region is not None:
                self._region.unlink()

    def publish(self, manifest: dict, arrays: dict[str, np.ndarray] | None = None, source: Any = None) -> int:
        """Hold a snapshot newer than any held (else ignore it: retries are idempotent); the newest version.

        `source`: an actor with `snapshot(version) -> arrays`, called here so this service owns the result.
        """
        version = int(manifest["version"])  # the manifest's own field (weight_sync.codecs.Manifest.to_json)
        if version <= self.version():
            return self.version()
        if source is not None:
            ref = source.snapshot.remote(version)
            ray.wait([ref], fetch_local=False)  # written by the source; this service is its owner
        elif arrays is not None:
            ref = ray.put(arrays)  # a copy of the argument, owned by this service
        else:
            raise ValueError("publish needs the snapshot's arrays or a source actor to pull them from")
        with self._lock:
            self._snapshots[version] = (manifest, ref)
            for old in sorted(self._snapshots)[: -self.keep]:
                del self._snapshots[old]  # dropping the last reference frees the object store entry
            return max(self._snapshots)

    def latest(self, after: int = -1) -> tuple[int, dict | None, list[ray.ObjectRef]]:
        """The newest snapshot if its version is greater than `after`, else (version, None, []).
        A snapshot in the region comes as (version, {"shm": name, "version": version}, []); one being
        written into it counts as the newest (its reader follows the write)."""
        with self._lock:
            stored = max(self._snapshots, default=-1)
            shm = max(self._shm_versions()[0], self._shm_writing())
            newest = max(stored, shm)
            if newest <= after:
                return newest, None, []
            if shm == newest:
                return newest, self._marker(newest), []
            manifest, ref = self._snapshots[newest]
        return newest, manifest, [ref]  # in a list, so Ray hands over the reference, not the arrays

    def get(self, version: int) -> tuple[int, dict | None, list[ray.ObjectRef]]:
        """(newest version, snapshot `version` if still held else None, [its ref]): async explorers load
        exactly the version they were asked for, even after a newer one arrived — or while the learner
        is still writing it into the region (its reader follows the write; `newest` counts it only once
        it is complete)."""
        with self._lock:
            shm = self._shm_versions()
            newest = max(max(self._snapshots, default=-1), shm[0])
            if version in self._snapshots:
                manifest, ref = self._snapshots[version]
                return newest, manifest, [ref]
            if version >= 0 and (version in shm or version == self._shm_writing()):
                return newest, self._marker(version), []
            return newest, None, []

    def version(self) -> int:
        with self._lock:
            return max(max(self._snapshots, default=-1), self._shm_versions()[0])

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"versions": sorted(self._snapshots), "node": self.node, "shm": describe(self._region),
                    "shm_unavailable": self.shm_unavailable}


def service_name(node_id: str) -> str:
    return f"solrl-weight-sync-{node_id[:8]}"


def start_services(keep: int = 2, tag: str = "", namespace: str | None = None,
                   shm_limit: int | None = None) -> dict[str, Any]:
    """One WeightSyncService per alive node, pinned to it (soft affinity would let it wander).

    `namespace` (default `solrl-<tag>`) makes the names private to one job: a job never picks up
    another's (or a crashed test's) service and its newer versions; `tag` also names its shared-memory
    regions; `shm_limit` caps each region's bytes (None: /dev/shm's free space; 0: the object store only).
    Actors receive the handles; the names are for the dashboard."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    actor = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1, max_concurrency=16)(WeightSyncService)
    handles = {}
    for node in ray.nodes():
        if not node["Alive"]:
            continue
        node_id = node["NodeID"]
        handles[node_id] = actor.options(
            name=service_name(node_id),
            namespace=namespace or f"solrl-{tag}",
            get_if_exists=True,
            lifetime=None,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote(keep, tag, shm_limit)
    return handles


def find_service(node_id: str, namespace: str, wait_s: float = 0.0, poll_s: float = 0.5) -> Any | None:
    """The weight-sync service of node `node_id` in the job's `namespace`, looked up by name, waiting up to
    `wait_s` for it to appear (None: it did not). For an actor placed on a node that joined after the
    job started: the driver starts that node's service (`cluster.runtime.driver.add_node_services`)
    between iterations and whenever the explorers go quiet."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return ray.get_actor(service_name(node_id), namespace=namespace)
        except ValueError:  # no such actor (yet)
            if time.monotonic() >= deadline:
                return None
            time.sleep(poll_s)


def stop_services(services: dict[str, Any], kill: bool = True) -> None:
    """End a job's services: each unlinks its region, then (kill) the actor goes. Safe to call twice."""
    refs = [s.stop.remote() for s in services.values()]
    with contextlib.suppress(Exception):
        ray.get(refs, timeout=30)
    if kill:
        for service in services.values():
            with contextlib.suppress(Exception):
                ray.kill(service, no_restart=True)
