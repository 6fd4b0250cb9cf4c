"""The explorer's side of weight sync: fetch the node's newest snapshot and load it into the engine."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import ray
import torch

from diffusion.lora import merge_lora
from weight_sync.codecs import CorruptSnapshot, Entry, Manifest, decode
from weight_sync.shm import Region

if TYPE_CHECKING:
    from diffusion.explore import ExploreEngine


class WeightSubscriber:
    """poll(): if the service holds a newer version, decode it into the engine and return its info.

    `engine` is the explorer's `ExploreEngine` (snapshots go through `engine.load`, which refreshes its
    quantizers). A `lora` snapshot carries adapters only, merged onto base weights (`merge_lora`): `base`
    gives them (the unmodified weights of at least the adapted layers), else they are taken from the engine
    at the first `lora` snapshot — a copy of the weights of the layers that snapshot adapts and of nothing
    else, which are still the weights the engine was built with as long as no snapshot has been loaded
    (an explorer's engine is the policy's own transformer, so no other copy of the model exists; without
    `base`, a first `lora` snapshot after one of another codec is refused). A snapshot in the node's
    shared-memory region (the service answers a marker, also for a version the learner is writing right
    now) is streamed from the mapping straight into `targets` — the engine's own tensors by state-dict
    key, by default those of `engine.module` (`weight_tensors`) — each chunk copied once, into its final
    place, while the learner writes the next (`Region.read_into`);
    NVFP4 entries are dequantized from the mapping as each arrives, CRC-32 checksums verified per entry;
    then `engine.load({})` refreshes the quantizers. The read is accepted only if the writer did not
    overtake it, else loaded again: the engine never keeps a torn snapshot, and while it is being
    rewritten `version` is -1 (no version held), so a read that fails leaves the engine marked as
    holding none. Snapshots that do not match the targets exactly (keys, shapes, dtypes), `lora`
    snapshots, and engines without targets are decoded whole and loaded through `engine.load` as before.
    `torn` counts retried reads; `followed` the accepted reads that began while the learner was writing.
    """

    def __init__(self, service: ray.actor.ActorHandle, engine: ExploreEngine,
                 base: dict[str, torch.Tensor] | None = None,
                 targets: Mapping[str, torch.Tensor] | None = None):
        self.service = service
        self.engine = engine
        self.base = base
        self.targets = targets
        self.pristine = True  # the engine still holds the weights it was built with (no snapshot written into it)
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
        """Load exactly `version` (newer or older than the one held) if the service still keeps it (or the
        learner is writing it: then the load follows the write). `self.newest` is then the service's newest
        complete version (-1: none)."""
        start = time.perf_counter()
        self.newest, manifest_json, refs = ray.get(self.service.get.remote(version))
        if manifest_json is None:
            return None
        return self._load(version, manifest_json, refs, start)

    @property
    def torn(self) -> int:
        return self._region.torn if self._region is not None else 0

    @property
    def followed(self) -> int:
        return self._region.followed if self._region is not None else 0

    def _load(self, version: int, manifest_json: dict, refs: list, start: float) -> dict[str, float] | None:
        if "shm" in manifest_json:
            return self._load_shm(manifest_json["shm"], version, start)
        manifest = Manifest.from_json(manifest_json)
        try:
            arrays = ray.get(refs[0])  # zero-copy, read-only views into the node's object store
        except ray.exceptions.ObjectLostError:
            return None  # its owner (a service that just restarted) died; the learner republishes
        fetched = time.perf_counter()
        self.apply(decode(arrays, manifest), manifest)
        self.version = version
        return {"version": version, "fetch_s": fetched - start, "load_s": time.perf_counter() - fetched}

    def _targets(self) -> Mapping[str, torch.Tensor] | None:
        if self.targets is None and hasattr(self.engine, "module"):
            from diffusion.quant.engine import weight_tensors

            self.targets = weight_tensors(self.engine.module)
        return self.targets

    def _load_shm(self, name: str, version: int, start: float) -> dict[str, float] | None:
        if self._region is None or self._region.name != name or self._region.closed:
            counts = (self.torn, self.followed)
            if self._region is not None:
                self._region.close()
            try:
                self._region = Region.attach(name)
            except FileNotFoundError:
                self._region = None
                return None  # replaced since the service answered; the next call gets the new name
            self._region.torn, self._region.followed = counts
        fetched = time.perf_counter()
        targets = self._targets()
        held = None
        if targets is not None:
            sink = _EngineSink(targets)
            previous, self.version = self.version, -1  # from here on the engine's tensors are being rewritten
            try:
                held = self._region.read_into(sink, version=version)
            except _NotDirect:
                self.version = previous  # refused in begin, before any destination was touched
            else:
                self.pristine = self.pristine and not sink.touched
                if held is None:
                    self.version = -1 if sink.touched else previous
                    return None  # that version's slot was rewritten meanwhile
                self.engine.load({}, strict=False, prequantized=sink.prequantized)  # refresh the quantizers
        if held is None:
            def consume(manifest_json: dict, arrays: dict) -> None:
                manifest = Manifest.from_json(manifest_json)
                self.apply(decode(arrays, manifest), manifest)  # decode's tensors view the mapping

            read = self._region.read(consume, version=version)
            if read is None:
                return None  # that version's slot was rewritten meanwhile
            held = read[0]
        self.version = held
        return {"version": held, "fetch_s": fetched - start, "load_s": time.perf_counter() - fetched}

    def apply(self, state: dict[str, torch.Tensor], manifest: Manifest) -> None:
        """Load a decoded snapshot into the engine: dense and NVFP4 entries as they are, a `lora` one
        merged onto the base weights (captured from the engine the first time)."""
        if manifest.codec == "lora":
            if self.base is None:
                self.base = self._capture_base(state)  # before the first load overwrites them
            merged = merge_lora(self.base, state, float(manifest.meta["lora_scale"]))
            self.pristine = False
            self.engine.load(merged, strict=False)
        else:
            self.pristine = False
            self.engine.load(state, prequantized=[e.name for e in manifest.entries if e.codec == "nvfp4"])

    def _capture_base(self, adapters: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Copies of the engine's weights of the layers `adapters` adapts ("<layer>.lora_A.weight" →
        "<layer>.weight"), taken before any snapshot overwrote them: what every later `lora` snapshot of
        the run merges onto (the learner's adapters always target the same layers)."""
        if not self.pristine:
            raise ValueError("a lora snapshot after the engine loaded another snapshot: its base weights are "
                             "gone (pass WeightSubscriber(base=...))")
        weights = self._targets()
        if weights is None:
            raise ValueError("a lora snapshot needs base weights: pass WeightSubscriber(base=...) or an engine "
                             "with a module")
        keys = [key.removesuffix(".lora_A.weight") + ".weight" for key in adapters if key.endswith(".lora_A.weight")]
        return {key: weights[key].detach().clone() for key in keys}


class _NotDirect(Exception):
    """The snapshot cannot be streamed into the targets (lora, or keys, shapes or dtypes differ)."""


def _parts(entry: Entry) -> list[str]:
    """The region's array keys of one manifest entry, in the order they were written."""
    if entry.codec == "nvfp4":
        return [f"{entry.name}/codes", f"{entry.name}/scales", f"{entry.name}/global"]
    return [entry.name]


class _EngineSink:
    """`Region.read_into`'s sink for the engine: dense entries are copied by the region straight into
    their (contiguous) target tensors as the writer publishes them; once an entry's arrays have all
    arrived it is verified (CRC-32, when the snapshot has checksums) and, if NVFP4 or without a
    contiguous target, decoded from the mapping and copied into its target. Accepts exactly the
    snapshots `engine.load(state, strict=True)` would: the same keys, shapes and dtypes."""

    def __init__(self, targets: Mapping[str, torch.Tensor]) -> None:
        self.targets = targets
        self.touched = False
        self.prequantized: list[str] = []
        self._manifest: Manifest | None = None
        self._owner: dict[str, Entry] = {}
        self._direct: set[str] = set()
        self._pending: dict[str, np.ndarray] = {}
        self._left: set[str] = set()

    def begin(self, manifest_json: dict, layout: dict) -> Mapping[str, Any]:
        manifest = Manifest.from_json(manifest_json)
        if manifest.codec == "lora" or {e.name for e in manifest.entries} != set(self.targets) or any(
                tuple(self.targets[e.name].shape) != e.shape
                or str(self.targets[e.name].dtype).removeprefix("torch.") != e.dtype for e in manifest.entries):
            raise _NotDirect
        self._manifest = manifest
        self._owner = {key: e for e in manifest.entries for key in _parts(e)}
        self._direct = {e.name for e in manifest.entries
                        if e.codec == "dense" and e.name in layout and self.targets[e.name].is_contiguous()}
        self._pending, self._left = {}, {e.name for e in manifest.entries}
        self.prequantized = [e.name for e in manifest.entries if e.codec == "nvfp4"]
        self.touched = True
        return {name: self.targets[name] for name in self._direct}

    def arrived(self, key: str, view: np.ndarray) -> None:
        entry = self._owner.get(key)
        if entry is None:
            return  # an array no entry names: decode would ignore it too
        self._pending[key] = view
        keys = _parts(entry)
        if not all(k in self._pending for k in keys):
            return
        parts = {k: self._pending.pop(k) for k in keys}
        assert self._manifest is not None
        one = Manifest(self._manifest.version, self._manifest.codec, (entry,), self._manifest.meta)
        state = decode(parts, one)  # verifies the entry's checksum; views the mapping (dense) or dequantizes
        if entry.name not in self._direct:
            with torch.no_grad():
                self.targets[entry.name].copy_(state[entry.name])
        self._left.discard(entry.name)

    def end(self) -> None:
        self._pending = {}
        if self._left:
            assert self._manifest is not None
            raise CorruptSnapshot(f"snapshot v{self._manifest.version} lacks the arrays of "
                                  f"{sorted(self._left)[0]!r} named by its manifest")
