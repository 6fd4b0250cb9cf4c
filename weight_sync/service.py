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
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import ray

from weight_sync.codecs import Manifest


class WeightSyncService:
    def __init__(self, keep: int = 2) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.keep = keep
        self._snapshots: dict[int, tuple[dict, ray.ObjectRef]] = {}
        self._lock = threading.Lock()

    def publish(self, manifest: dict, arrays: dict[str, np.ndarray] | None = None, source: Any = None) -> int:
        """Hold a snapshot newer than any held (else ignore it: retries are idempotent); the newest version.

        `source`: an actor with `snapshot(version) -> arrays`, called here so this service owns the result.
        """
        version = Manifest.from_json(manifest).version
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
        """The newest snapshot if its version is greater than `after`, else (version, None, [])."""
        with self._lock:
            newest = max(self._snapshots, default=-1)
            if newest <= after:
                return newest, None, []
            manifest, ref = self._snapshots[newest]
        return newest, manifest, [ref]  # in a list, so Ray hands over the reference, not the arrays

    def get(self, version: int) -> tuple[int, dict | None, list[ray.ObjectRef]]:
        """(newest version, snapshot `version` if still held else None, [its ref]): async explorers load
        exactly the version they were asked for, even after a newer one arrived."""
        with self._lock:
            newest = max(self._snapshots, default=-1)
            if version not in self._snapshots:
                return newest, None, []
            manifest, ref = self._snapshots[version]
        return newest, manifest, [ref]

    def version(self) -> int:
        with self._lock:
            return max(self._snapshots, default=-1)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"versions": sorted(self._snapshots), "node": ray.get_runtime_context().get_node_id()}


def service_name(node_id: str, tag: str = "") -> str:
    return f"solrl_weight_sync_{tag + '_' if tag else ''}{node_id[:16]}"


def start_services(keep: int = 2, tag: str = "") -> dict[str, Any]:
    """One WeightSyncService per alive node, pinned to it (soft affinity would let it wander).

    `tag` makes the names private to one job: a job never picks up another's (or a crashed test's)
    service and its newer versions. Actors receive the handles; the names are for the dashboard."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    actor = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1, max_concurrency=16)(WeightSyncService)
    handles = {}
    for node in ray.nodes():
        if not node["Alive"]:
            continue
        node_id = node["NodeID"]
        handles[node_id] = actor.options(
            name=service_name(node_id, tag),
            get_if_exists=True,
            lifetime=None,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote(keep)
    return handles
