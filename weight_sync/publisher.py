"""The learner's side of weight sync: encode the sampling policy once, hand it to every node's service."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import ray
import torch

from weight_sync.codecs import Codec, encode, payload_bytes
from weight_sync.shm import Region, slot_bytes


class WeightPublisher:
    """publish(state, version): one encode, then every node's service takes the snapshot.

    With `source` (the learner actor's own handle; it must serve `snapshot(version)` concurrently) each
    service pulls the snapshot and owns it: one serialization into the object store per node. Without
    it (a plain process) the arrays travel as an argument and each service stores a copy.
    `quantize` names the tensors the `nvfp4` codec packs (the engine's quantized Linear weights).
    The newest snapshot is kept so a restarted (empty) service can be re-sent it (`republish`).

    `shm` (default on): the service of this process's own node gets the snapshot through its shared-memory
    region instead — written once here, mapped by the node's readers (`weight_sync.shm`); the services of
    other nodes still take it through the object store. Checksums then guard against bugs and weakly
    ordered CPUs; the region's sequence check already rejects torn reads. When that service cannot make
    a region (too little room in /dev/shm: it warns), its node is sent snapshots through the object store.

    A node that leaves the cluster takes its service with it (pinned there, it cannot restart elsewhere):
    Ray then answers every call to it with `ActorUnschedulableError`, and the publisher drops that node
    (`lost_nodes`) instead of failing the job; its readers are gone with it.
    """

    def __init__(self, services: Mapping[str, Any], codec: Codec, quantize: Iterable[str] = (), source: Any = None,
                 checksums: bool = True, shm: bool = True):
        self.services = dict(services)
        self.node = ray.get_runtime_context().get_node_id() if shm and ray.is_initialized() else None
        self.local = self.node if self.node in self.services else None
        self._region: Region | None = None
        self.checksums = checksums
        self.codec = codec
        self.quantize = tuple(quantize)
        self.source = source
        self.version = -1
        self._manifest: dict | None = None
        self._arrays: dict[str, np.ndarray] | None = None
        self.lost_nodes: list[str] = []

    def _results(self, refs: dict[str, ray.ObjectRef]) -> dict[str, Any]:
        """Each node's answer; nodes that left the cluster are dropped (they answer no more)."""
        out = {}
        for node, ref in refs.items():
            try:
                out[node] = ray.get(ref)
            except ray.exceptions.ActorUnschedulableError:  # its node is gone: not a RayActorError
                self.services.pop(node, None)
                self.lost_nodes.append(node)
        return out

    def publish(self, state: Mapping[str, torch.Tensor], version: int, meta: dict | None = None) -> dict[str, float]:
        start = time.perf_counter()
        arrays, manifest = encode(state, self.codec, version=version, quantize=self.quantize, meta=meta,
                                  checksums=self.checksums)
        self.version, self._manifest, self._arrays = version, manifest.to_json(), arrays
        encoded = time.perf_counter()
        local = self.local
        refs = {node: self._send(service) for node, service in self.services.items() if node != local}
        if local is not None and not self._write_local():
            refs[local] = self._send(self.services[local])  # no region there: the object store
        self._results(refs)
        return {"encode_s": encoded - start, "publish_s": time.perf_counter() - encoded,
                "bytes": float(payload_bytes(arrays))}

    def _write_local(self, force: bool = False) -> bool:
        """Write the newest snapshot into this node's region (asking the service for it when there is
        none, it is too small, or the service replaced it: restarted, grown, stopped). False when the
        service could not make one (no room in /dev/shm; it warned): from then on this node is sent its
        snapshots through the object store, as the other nodes are."""
        assert self._manifest is not None and self._arrays is not None
        need = slot_bytes(payload_bytes(self._arrays), len(self._arrays), len(json.dumps(self._manifest)))
        for _ in range(3):
            region = self._region
            if force or region is None or region.closed or region.capacity < need:
                if region is not None:
                    region.close()
                    self._region = None
                name = ray.get(self.services[self.local].region.remote(need))
                if name is None:
                    self.local = None
                    return False
                region = self._region = Region.attach(name)
                force = False
            region.write(self._manifest, self._arrays)
            if not region.closed:
                return True
        raise RuntimeError("the weight-sync service kept replacing its shared-memory region")

    def snapshot(self, version: int) -> dict[str, np.ndarray]:
        """The arrays of the newest snapshot, for a service pulling `version`."""
        if version != self.version or self._arrays is None:
            raise LookupError(f"snapshot v{version} is not the newest (v{self.version}); it was superseded")
        return self._arrays

    def _send(self, service):
        if self.source is not None:
            return service.publish.remote(self._manifest, source=self.source)
        return service.publish.remote(self._manifest, self._arrays)

    def republish(self) -> list[str]:
        """Re-send the newest snapshot to every service that is behind (e.g. restarted); their node ids."""
        if self._manifest is None:
            return []
        versions = self._results({node: s.version.remote() for node, s in self.services.items()})
        behind = [node for node, v in versions.items() if v < self.version]
        local = self.local
        refs = {node: self._send(self.services[node]) for node in behind if node != local}
        if local in behind and not self._write_local(force=True):  # a restarted service made a new region
            refs[local] = self._send(self.services[local])  # or could not: the object store
        self._results(refs)
        return behind
