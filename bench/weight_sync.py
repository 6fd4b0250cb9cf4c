"""Weight-sync bandwidth: publish → fetch → load, against this machine's memcpy, in the same run.

    python -m bench.weight_sync [--sizes-mb 1,16,128,1024] [--repeats 3] --json FILE

For each payload size: a state of 16 float32 tensors is published from an actor exactly as the learner
does (encode, then the node's WeightSyncService pulls the snapshot and owns it: one serialization into
the object store), fetched by a reader (latest + zero-copy get) and loaded into preallocated,
already-touched tensors (decode + copy), with CRC-32 checksums written and verified, and without.
Each size first runs a few unmeasured syncs, so both configurations meet a warmed object store.
The ceiling is one copy between preallocated touched tensors with the same primitive (torch copy_);
the path makes two copies (into the object store, out into the engine), so 50% of it is what the
design can reach. Medians over repeats.
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
from weight_sync.service import start_services

TENSORS = 16


def memcpy_gbps(nbytes: int, repeats: int) -> float:
    src = torch.ones(nbytes // 4)
    dst = torch.zeros_like(src)
    dst.copy_(src)  # touch both
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    return nbytes / float(np.median(times)) / 1e9


class Source:
    """Stands in for the learner actor: holds a state, publishes it, serves the services' pulls."""

    def __init__(self, services: dict, size_bytes: int, checksums: bool) -> None:
        per = size_bytes // TENSORS // 4
        self.state = {f"w{i}": torch.randn(per) for i in range(TENSORS)}
        self.publisher = WeightPublisher(services, "dense", source=ray.get_runtime_context().current_actor,
                                         checksums=checksums)

    def publish(self, version: int) -> float:
        start = time.perf_counter()
        self.publisher.publish(self.state, version)
        return time.perf_counter() - start

    def snapshot(self, version: int) -> dict:
        return self.publisher.snapshot(version)

    def tensor(self, name: str) -> torch.Tensor:
        return self.state[name]


def sync_once(source, service, targets, version: int, verify: bool) -> dict[str, float]:
    t0 = time.perf_counter()
    ray.get(source.publish.remote(version))
    t1 = time.perf_counter()
    _, manifest, refs = ray.get(service.latest.remote(version - 1))
    arrays = ray.get(refs[0])
    t2 = time.perf_counter()
    decoded = decode(arrays, Manifest.from_json(manifest), verify=verify)
    for name, tensor in decoded.items():
        targets[name].copy_(tensor)
    t3 = time.perf_counter()
    return {"publish_s": t1 - t0, "fetch_s": t2 - t1, "load_s": t3 - t2, "total_s": t3 - t0}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes-mb", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16, 128, 1024])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args(argv)
    biggest = max(args.sizes_mb) * 2**20
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=int(3.5 * biggest) + 2**28,
             log_to_driver=False)
    services = start_services(keep=1)  # owned by this driver, so they outlive each source
    service = next(iter(services.values()))
    rows, version = [], 0
    for size_mb in args.sizes_mb:
        nbytes = size_mb * 2**20
        ceiling = memcpy_gbps(nbytes, args.repeats + 2)
        # The object store's first snapshots of a new size land in fresh shared memory (page faults, arena
        # growth) for several publishes: unwarmed, whichever configuration ran first looked ~9× slower.
        warm = ray.remote(Source).options(max_concurrency=2, num_cpus=0).remote(services, nbytes, False)
        scratch = {f"w{i}": torch.zeros(nbytes // TENSORS // 4) for i in range(TENSORS)}
        for _ in range(args.repeats + 2):
            version += 1
            sync_once(warm, service, scratch, version, verify=False)
        ray.kill(warm)
        del scratch
        for checksums in (True, False):
            source = ray.remote(Source).options(max_concurrency=2, num_cpus=0).remote(services, nbytes, checksums)
            targets = {f"w{i}": torch.zeros(nbytes // TENSORS // 4) for i in range(TENSORS)}
            runs = []
            for _ in range(args.repeats + 1):  # the first one warms the store and the targets
                version += 1
                runs.append(sync_once(source, service, targets, version, verify=checksums))
            assert torch.equal(targets["w3"], ray.get(source.tensor.remote("w3")))
            ray.kill(source)
            med = {k: float(np.median([r[k] for r in runs[1:]])) for k in runs[0]}
            gbps = nbytes / med["total_s"] / 1e9
            rows.append({"size_mb": size_mb, "checksums": checksums, "memcpy_gbps": ceiling, "sync_gbps": gbps,
                         "ratio": gbps / ceiling, **med})
            print(f"{size_mb:6d} MB  checksums {checksums!s:5}  memcpy {ceiling:6.2f} GB/s  sync {gbps:6.2f} GB/s  "
                  f"ratio {gbps / ceiling:5.1%}  (publish {med['publish_s'] * 1e3:7.1f} ms, fetch "
                  f"{med['fetch_s'] * 1e3:5.1f} ms, load {med['load_s'] * 1e3:7.1f} ms)", flush=True)
            del targets
    ray.shutdown()
    print("\n| payload | checksums | memcpy GB/s | publish→fetch→load GB/s | ratio | publish ms | fetch ms | load ms |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['size_mb']} MB | {'yes' if r['checksums'] else 'no'} | {r['memcpy_gbps']:.2f} | "
              f"{r['sync_gbps']:.2f} | {r['ratio']:.0%} | "
              f"{r['publish_s'] * 1e3:.1f} | {r['fetch_s'] * 1e3:.1f} | {r['load_s'] * 1e3:.1f} |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
