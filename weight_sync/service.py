"""The weight-sync service: one Ray actor per node holding the newest policy snapshots.

    publish(manifest, [ref]) → version         (the learner, once per update, to every node's service)
    latest(after) → (version, manifest, [ref]) (readers on the node; ray.get(ref) maps the arrays zero-copy)

The publisher puts each snapshot into the object store *owned by the service* (`ray.put(...,
_owner=service)`): one copy, and a learner that crashes after publishing loses nothing. Snapshots
are immutable Ray objects, so a reader can never see a torn or mixed version; versions only
increase; all but the newest `keep` are released. The service is restartable (max_restarts=-1):
a restarted one is empty and answers version -1 until the learner republishes to it.
"""

from __future__ import annotations

from typing import Any

import ray

from weight_sync.codecs import Manifest


class WeightSyncService:
    def __init__(self, keep: int = 2) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.keep = keep
        self._snapshots: dict[int, tuple[dict, ray.ObjectRef]] = {}

    def publish(self, manifest: dict, refs: list[ray.ObjectRef]) -> int:
        """Hold a snapshot (a newer version than any held); returns the newest version held.

        `refs` = [the snapshot's object], passed in a list so Ray hands over the reference unresolved.
        """
        version = Manifest.from_json(manifest).version
        newest = max(self._snapshots, default=-1)
        if version <= newest:
            return newest  # a retry or a late duplicate: idempotent
        self._snapshots[version] = (manifest, refs[0])
        for old in sorted(self._snapshots)[: -self.keep]:
            del self._snapshots[old]  # dropping the last reference frees the object store entry
        return version

    def latest(self, after: int = -1) -> tuple[int, dict | None, list[ray.ObjectRef]]:
        """The newest snapshot if its version is greater than `after`, else (version, None, [])."""
        newest = max(self._snapshots, default=-1)
        if newest <= after:
            return newest, None, []
        manifest, ref = self._snapshots[newest]
        return newest, manifest, [ref]  # in a list, so Ray hands over the reference, not the arrays

    def version(self) -> int:
        return max(self._snapshots, default=-1)

    def stats(self) -> dict[str, Any]:
        return {"versions": sorted(self._snapshots), "node": ray.get_runtime_context().get_node_id()}


def service_name(node_id: str) -> str:
    return f"solrl_weight_sync_{node_id[:16]}"


def start_services(keep: int = 2) -> dict[str, Any]:
    """One WeightSyncService per alive node, pinned to it (soft affinity would let it wander)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    actor = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)(WeightSyncService)
    handles = {}
    for node in ray.nodes():
        if not node["Alive"]:
            continue
        node_id = node["NodeID"]
        handles[node_id] = actor.options(
            name=service_name(node_id),
            get_if_exists=True,
            lifetime=None,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote(keep)
    return handles
