"""The learner's side of weight sync: encode the sampling policy once, hand it to every node's service."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import ray
import torch

from weight_sync.codecs import Codec, encode, payload_bytes


class WeightPublisher:
    """publish(state, version): one encode, then every node's service takes the snapshot.

    With `source` (the learner actor's own handle; it must serve `snapshot(version)` concurrently) each
    service pulls the snapshot and owns it: one serialization into the object store per node. Without
    it (a plain process) the arrays travel as an argument and each service stores a copy.
    `quantize` names the tensors the `nvfp4` codec packs (the engine's quantized Linear weights).
    The newest snapshot is kept so a restarted (empty) service can be re-sent it (`republish`).
    """

    def __init__(self, services: Mapping[str, Any], codec: Codec, quantize: Iterable[str] = (), source: Any = None,
                 checksums: bool = True):
        self.services = dict(services)
        self.checksums = checksums
        self.codec = codec
        self.quantize = tuple(quantize)
        self.source = source
        self.version = -1
        self._manifest: dict | None = None
        self._arrays: dict[str, np.ndarray] | None = None

    def publish(self, state: Mapping[str, torch.Tensor], version: int, meta: dict | None = None) -> dict[str, float]:
        start = time.perf_counter()
        arrays, manifest = encode(state, self.codec, version=version, quantize=self.quantize, meta=meta,
                                  checksums=self.checksums)
        self.version, self._manifest, self._arrays = version, manifest.to_json(), arrays
        encoded = time.perf_counter()
        ray.get([self._send(service) for service in self.services.values()])
        return {"encode_s": encoded - start, "publish_s": time.perf_counter() - encoded,
                "bytes": float(payload_bytes(arrays))}

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
        versions = ray.get([s.version.remote() for s in self.services.values()])
        behind = [node for node, v in zip(self.services, versions, strict=True) if v < self.version]
        ray.get([self._send(self.services[node]) for node in behind])
        return behind
