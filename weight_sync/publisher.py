"""The learner's side of weight sync: encode the sampling policy once, hand it to every node's service."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

import ray
import torch

from weight_sync.codecs import Codec, encode, payload_bytes


class WeightPublisher:
    """publish(state, version): one encode, one object-store put, one transfer per node.

    `quantize` names the tensors the `nvfp4` codec packs (the engine's quantized Linear weights).
    Remembers the newest snapshot so a restarted (empty) service can be re-sent it (`republish`).
    """

    def __init__(self, services: Mapping[str, ray.actor.ActorHandle], codec: Codec, quantize: Iterable[str] = ()):
        self.services = dict(services)
        self.codec = codec
        self.quantize = tuple(quantize)
        self._last: tuple[dict, dict[str, ray.ObjectRef]] | None = None
        self._snapshot_arrays: dict | None = None  # the newest encoded snapshot, for republishing
        self.version = -1

    def publish(self, state: Mapping[str, torch.Tensor], version: int, meta: dict | None = None) -> dict[str, float]:
        start = time.perf_counter()
        arrays, manifest = encode(state, self.codec, version=version, quantize=self.quantize, meta=meta)
        self._snapshot_arrays = arrays
        encoded = time.perf_counter()
        # One object per node's service, owned by that service: it outlives this (learner) process.
        refs = {node: ray.put(arrays, _owner=service) for node, service in self.services.items()}
        self._last, self.version = (manifest.to_json(), refs), version
        ray.get([s.publish.remote(manifest.to_json(), [refs[node]]) for node, s in self.services.items()])
        return {"encode_s": encoded - start, "publish_s": time.perf_counter() - encoded,
                "bytes": float(payload_bytes(arrays))}

    def republish(self) -> list[str]:
        """Re-send the newest snapshot to every service that is behind (e.g. restarted); their node ids."""
        if self._last is None:
            return []
        versions = dict(zip(self.services, ray.get([s.version.remote() for s in self.services.values()]),
                            strict=True))
        behind = [node for node, v in versions.items() if v < self.version]
        manifest, _ = self._last
        for node in behind:  # the lost object was owned by the dead service: put it again
            self._last[1][node] = ray.put(self._snapshot_arrays, _owner=self.services[node])
            ray.get(self.services[node].publish.remote(manifest, [self._last[1][node]]))
        return behind
