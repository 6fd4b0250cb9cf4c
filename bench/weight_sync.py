"""Weight-sync bandwidth: publish → consume, every path, against this machine's memcpy, in one run.

    python -m bench.weight_sync [--sizes-mb 16,128,1024] [--repeats 5] [--iteration-s 427] --json FILE

For each payload size: a state of 16 float32 tensors is published from an actor exactly as the learner
does and consumed by a reader into preallocated, already-touched tensors (the engine's weights), through
- `store`: the object store (the node's WeightSyncService pulls the snapshot and owns it: one
  serialization into the store; the reader maps it zero-copy, decodes and copies),
- `shm sequential`: the shared-memory region as it was read before the pipelined protocol — the publish
  returns, then the reader asks the service, decodes from the mapping and copies, then checks the
  sequence: two copies back to back, so 50% of the ceiling is its bound,
- `shm pipelined`: the reader (`WeightSubscriber.fetch`, what an explorer waiting for a version calls)
  is asked for the version as the publish is sent, learns from the service that it is being written,
  and follows the write chunk by chunk, copying each straight into the engine's tensors while the
  learner fills the next: the two copies overlap, so the bound is the ceiling itself (less one chunk),
each without checksums and with CRC-32 checksums written and verified.
The pipelined reader asks the service every millisecond until the write has begun (the explorer's own
loop waits 20 ms): the wait for the publish to reach the actor is part of the time measured.

Time per sync: from sending the publish until both the reader holds the verified snapshot and the publish
has returned. Each configuration first runs a few unmeasured syncs (fresh shared memory is page-faulted
in, the object store's arena grows: unwarmed, the first configuration looked ~9× slower). The ceiling is
one copy between preallocated touched tensors with the same primitive (torch copy_, one thread), taken
once before every measured sync, so the ceiling and the path meet the same moments of a shared machine;
the ratio divides their medians. Then the modelled sync share of an SD3.5-L iteration for its two
payloads (`PAYLOADS`), at the rate measured for the nearest size.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import ray
import torch

from weight_sync.codecs import Manifest, decode
from weight_sync.publisher import WeightPublisher
from weight_sync.service import start_services, stop_services
from weight_sync.shm import Region
from weight_sync.subscriber import WeightSubscriber

TENSORS = 16
# (path, checksums): the rows of each size, in the order they run
CONFIGS = (("store", False), ("shm sequential", False), ("shm pipelined", False), ("shm sequential", True),
           ("shm pipelined", True))
# SD3.5-L transformer (8.146 B parameters): 38 joint blocks of width d = 2432, each with 36·d² in Linears
# (q, k, v, out, 4d MLP, 6d adaLN, for the image and the text stream) → ≈ 8.09 B quantized, 0.06 B not.
# NVFP4 is 4 bits + one E4M3 scale per 16 elements = 0.5625 B per element; the rest travels as bf16.
# LoRA (the preset: rank 32 on the 8 attention projections of each block, 303 Linears of d × d, fp32):
# 303 · 32 · 2d parameters · 4 B.
PAYLOADS = {
    "sd35_large lora r32 (fp32 adapters)": 303 * 32 * 2 * 2432 * 4,
    "sd35_large dense nvfp4": int(8.09e9 * 0.5625 + 0.056e9 * 2),
}


class Ceiling:
    """One single-thread copy of `nbytes` between preallocated, touched tensors, timed on request."""

    def __init__(self, nbytes: int) -> None:
        self.src = torch.ones(nbytes // 4)
        self.dst = torch.zeros_like(self.src)
        self.dst.copy_(self.src)  # touch both

    def seconds(self) -> float:
        start = time.perf_counter()
        self.dst.copy_(self.src)
        return time.perf_counter() - start


class Source:
    """Stands in for the learner actor: holds a state, publishes it, serves the services' pulls."""

    def __init__(self, services: dict, size_bytes: int, checksums: bool, shm: bool) -> None:
        per = size_bytes // TENSORS // 4
        self.state = {f"w{i}": torch.randn(per) for i in range(TENSORS)}
        self.publisher = WeightPublisher(services, "dense", source=ray.get_runtime_context().current_actor,
                                         checksums=checksums, shm=shm)

    def publish(self, version: int) -> float:
        start = time.perf_counter()
        self.publisher.publish(self.state, version)
        return time.perf_counter() - start

    def snapshot(self, version: int) -> dict:
        return self.publisher.snapshot(version)

    def tensor(self, name: str) -> torch.Tensor:
        return self.state[name]


class Engine:
    """The reader's engine: its weights are preallocated tensors; `load` copies a decoded state into them."""

    def __init__(self, weights: dict[str, torch.Tensor]) -> None:
        self.weights = weights

    def load(self, state, strict: bool = True, prequantized=()) -> None:
        for name, tensor in state.items():
            self.weights[name].copy_(tensor)


_regions: dict[str, Region] = {}


def sync_sequential(source, service, targets, version: int, verify: bool) -> dict[str, float]:
    """Publish, then fetch, then load: the object store, or the region read after the write."""
    t0 = time.perf_counter()
    ray.get(source.publish.remote(version))
    t1 = time.perf_counter()
    _, manifest, refs = ray.get(service.latest.remote(version - 1))

    def load(manifest: dict, arrays: dict) -> None:
        for name, tensor in decode(arrays, Manifest.from_json(manifest), verify=verify).items():
            targets[name].copy_(tensor)

    if "shm" in manifest:  # decode from the mapping into the tensors, then check the sequence
        name = manifest["shm"]
        if name not in _regions:
            _regions[name] = Region.attach(name)
        t2 = time.perf_counter()
        held, _ = _regions[name].read(load, version=version)
        assert held == version
    else:
        arrays = ray.get(refs[0])
        t2 = time.perf_counter()
        load(manifest, arrays)
    t3 = time.perf_counter()
    return {"publish_s": t1 - t0, "fetch_s": t2 - t1, "load_s": t3 - t2, "total_s": t3 - t0}


def sync_pipelined(source, subscriber: WeightSubscriber, version: int) -> dict[str, float]:
    """Send the publish, and at once ask the subscriber for the version: it follows the write."""
    t0 = time.perf_counter()
    ref = source.publish.remote(version)
    asked = 0
    while (info := subscriber.fetch(version)) is None:
        asked += 1
        time.sleep(0.001)
    t1 = time.perf_counter()
    publish_s = ray.get(ref)
    t2 = time.perf_counter()
    assert info["version"] == version == subscriber.version
    return {"publish_s": publish_s, "fetch_s": info["fetch_s"], "load_s": info["load_s"], "consumed_s": t1 - t0,
            "total_s": t2 - t0, "asked": asked}


def measure(services: dict, service, nbytes: int, path: str, checksums: bool, repeats: int,
            version: int) -> tuple[dict, int]:
    ceiling = Ceiling(nbytes)
    source = ray.remote(Source).options(max_concurrency=2, num_cpus=0).remote(services, nbytes, checksums,
                                                                              path != "store")
    targets = {f"w{i}": torch.zeros(nbytes // TENSORS // 4) for i in range(TENSORS)}
    subscriber = WeightSubscriber(service, Engine(targets), targets=targets)
    runs, copies = [], []
    for index in range(repeats + 3):
        version += 1
        if index >= 3:
            copies.append(ceiling.seconds())
        if path == "shm pipelined":
            runs.append(sync_pipelined(source, subscriber, version))
        else:
            runs.append(sync_sequential(source, service, targets, version, verify=checksums))
    assert torch.equal(targets["w3"], ray.get(source.tensor.remote("w3")))
    followed = subscriber.followed
    ray.kill(source)
    if subscriber._region is not None:
        subscriber._region.close()
    med = {k: float(np.median([r[k] for r in runs[3:]])) for k in runs[0]}
    memcpy = nbytes / float(np.median(copies)) / 1e9
    gbps = nbytes / med["total_s"] / 1e9
    row = {"size_mb": nbytes // 2**20, "path": path, "checksums": checksums, "memcpy_gbps": memcpy,
           "sync_gbps": gbps, "ratio": gbps / memcpy, **med}
    if path == "shm pipelined":
        row["followed"] = followed  # of the repeats + 3 syncs, those whose read began during the write
        row["torn"] = subscriber.torn
    return row, version


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes-mb", type=lambda s: [int(x) for x in s.split(",")], default=[16, 128, 1024])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--iteration-s", type=float, default=427.0,
                        help="the iteration the sync share is modelled against (the paper's colocated SD3.5-L)")
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args(argv)
    # One thread everywhere: Ray runs the (num_cpus=0) publishing actor with one, and on shared cores
    # torch's spinning OpenMP threads made copies up to 10× slower; the ceiling is then one core's copy.
    torch.set_num_threads(1)
    biggest = max(args.sizes_mb) * 2**20
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=int(3.5 * biggest) + 2**28,
             log_to_driver=False)
    services = start_services(keep=1, tag="bench")  # owned by this driver, so they outlive each source
    service = next(iter(services.values()))
    rows, version = [], 0
    for size_mb in args.sizes_mb:
        for path, checksums in CONFIGS:
            row, version = measure(services, service, size_mb * 2**20, path, checksums, args.repeats, version)
            rows.append(row)
            print(f"{size_mb:6d} MB  {path:14}  checksums {checksums!s:5}  memcpy {row['memcpy_gbps']:6.2f} GB/s  "
                  f"sync {row['sync_gbps']:6.2f} GB/s  ratio {row['ratio']:5.1%}  (publish "
                  f"{row['publish_s'] * 1e3:7.1f} ms, fetch {row['fetch_s'] * 1e3:5.1f} ms, load "
                  f"{row['load_s'] * 1e3:7.1f} ms, total {row['total_s'] * 1e3:7.1f} ms)", flush=True)
    for region in _regions.values():
        region.close()
    stop_services(services)
    ray.shutdown()
    print("\n| payload | checksums | memcpy GB/s | object store GB/s (ratio) | shm sequential GB/s (ratio) "
          "| shm pipelined GB/s (ratio) |")
    print("|---|---|---|---|---|---|")
    for size_mb in args.sizes_mb:
        for checksums in (False, True):
            cells = {r["path"]: r for r in rows if r["size_mb"] == size_mb and r["checksums"] == checksums}
            memcpy = float(np.median([r["memcpy_gbps"] for r in cells.values()]))
            text = [f"{cells[p]['sync_gbps']:.2f} ({cells[p]['ratio']:.0%})" if p in cells else "—"
                    for p in ("store", "shm sequential", "shm pipelined")]
            print(f"| {size_mb} MB | {'CRC-32' if checksums else 'no'} | {memcpy:.2f} | {' | '.join(text)} |")
    model = []
    print(f"\n| modelled payload | MB | path | sync s | share of a {args.iteration_s:.0f} s iteration |")
    print("|---|---|---|---|---|")
    for label, nbytes in PAYLOADS.items():
        nearest = min(args.sizes_mb, key=lambda mb: abs(np.log(mb * 2**20 / nbytes)))
        for path in ("store", "shm pipelined"):
            rate = next(r["sync_gbps"] for r in rows if r["size_mb"] == nearest and r["path"] == path
                        and not r["checksums"])
            seconds = nbytes / rate / 1e9
            model.append({"payload": label, "bytes": nbytes, "path": path, "rate_of_size_mb": nearest,
                          "sync_s": seconds, "iteration_s": args.iteration_s, "share": seconds / args.iteration_s})
            print(f"| {label} | {nbytes / 2**20:.0f} | {path} | {seconds:.3f} | {seconds / args.iteration_s:.3%} |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"rows": rows, "modelled": model}, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
