"""The explorer's side of weight sync: fetch the node's newest snapshot and load it into the engine."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import ray
import torch

from diffusion.lora import merge_lora
from weight_sync.codecs import Manifest, decode
from weight_sync.shm import Region

if TYPE_CHECKING:
    from diffusion.explore import ExploreEngine


class WeightSubscriber:
    """poll(): if the service holds a newer version, decode it into the engine and return its info.

    `engine` is the explorer's `ExploreEngine` (snapshots go through `engine.load`, which refreshes its
    quantizers). `base` (the explorer's own unmodified transformer weights) is needed for the `lora`
    codec only. A snapshot in the node's shared-memory region (the service answers a marker) is decoded
    straight from the mapping into the engine, then accepted only if the writer did not overtake the read
    (else loaded again): the engine never keeps a torn snapshot. `torn` counts such retried reads.
    """

    def __init__(self, service: ray.actor.ActorHandle, engine: ExploreEngine,
                 base: dict[str, torch.Tensor] | None = None):
        self.service = service
        self.engine = engine
        self.base = base
        self.version = -1
        self.newest = -1  # the service's newest version, as of the last fetch
        self._region: Region | None = None

    def poll(self) -> dict[str, float] | None:
        """Load the service's newest snapshot if it is newer than the one held; its info, else None."""
        start = time.perf_counter()
        version, manifest_json, refs = ray.get(self.service.latest.remote(self.version))
        if manifest_json is None:
            return None
        return self._load(version, manifest_json, refs, start)

    def fetch(self, version: int) -> dict[str, float] | None:
        """Load exactly `version` (newer or older than the one held) if the service still keeps it.
        `self.newest` is then the service's newest version (-1: none)."""
        start = time.perf_counter()
        self.newest, manifest_json, refs = ray.get(self.service.get.remote(version))
        if manifest_json is None:
            return None
        return self._load(version, manifest_json, refs, start)

    @property
    def torn(self) -> int:
        return self._region.torn if self._region is not None else 0

    def _load(self, version: int, manifest_json: dict, refs: list, start: float) -> dict[str, float] | None:
        if "shm" in manifest_json:
            return self._load_shm(manifest_json["shm"], version, start)
        manifest = Manifest.from_json(manifest_json)
        try:
            arrays = ray.get(refs[0])  # zero-copy, read-only views into the node's object store
        except ray.exceptions.ObjectLostError:
            return None  # its owner (a service that just restarted) died; the learner republishes
        fetched = time.perf_counter()
        self._apply(decode(arrays, manifest), manifest)
        self.version = version
        return {"version": version, "fetch_s": fetched - start, "load_s": time.perf_counter() - fetched}

    def _load_shm(self, name: str, version: int, start: float) -> dict[str, float] | None:
        if self._region is None or self._region.name != name or self._region.closed:
            torn = self.torn
            if self._region is not None:
                self._region.close()
            try:
                self._region = Region.attach(name)
            except FileNotFoundError:
                self._region = None
                return None  # replaced since the service answered; the next call gets the new name
            self._region.torn += torn
        fetched = time.perf_counter()

        def consume(manifest_json: dict, arrays: dict) -> None:
            manifest = Manifest.from_json(manifest_json)
            self._apply(decode(arrays, manifest), manifest)  # decode's tensors view the mapping

        read = self._region.read(consume, version=version)
        if read is None:
            return None  # that version's slot was rewritten meanwhile
        self.version = read[0]
        return {"version": read[0], "fetch_s": fetched - start, "load_s": time.perf_counter() - fetched}

    def _apply(self, state: dict[str, torch.Tensor], manifest: Manifest) -> None:
        if manifest.codec == "lora":
            if self.base is None:
                raise ValueError("a lora snapshot needs the explorer's base weights (WeightSubscriber(base=...))")
            scale = float(manifest.meta["lora_scale"])
            self.engine.load(merge_lora(self.base, state, scale), strict=False)
        else:
            prequantized = [e.name for e in manifest.entries if e.codec == "nvfp4"]
            self.engine.load(state, prequantized=prequantized)
