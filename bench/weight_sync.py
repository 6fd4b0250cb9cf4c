"""Weight-sync bandwidth: publish → fetch → load, against this machine's memcpy, in the same run.

    python -m bench.weight_sync [--sizes-mb 1,16,128,1024] [--repeats 3] --json FILE

For each payload size: a state of 16 float32 tensors is published through a real WeightSyncService
on a local Ray (encode + one put owned by the service), fetched by a reader (latest + zero-copy get)
and loaded into preallocated, already-touched tensors (decode + copy). The ceiling is one plain copy
between preallocated touched buffers (memcpy); the path makes two copies (into the object store, out
into the engine), so 50% of memcpy is what the design can reach. Medians over repeats.
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
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.zeros_like(src)
    np.copyto(dst, src)  # touch both
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - start)
    return nbytes / float(np.median(times)) / 1e9


def sync_once(publisher: WeightPublisher, service, state, targets, version: int) -> dict[str, float]:
    t0 = time.perf_counter()
    publisher.publish(state, version)
    t1 = time.perf_counter()
    _, manifest, refs = ray.get(service.latest.remote(version - 1))
    arrays = ray.get(refs[0])
    t2 = time.perf_counter()
    decoded = decode(arrays, Manifest.from_json(manifest), verify=False)
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
    services = start_services(keep=1)
    service = next(iter(services.values()))
    publisher = WeightPublisher(services, "dense")
    rows, version = [], 0
    for size_mb in args.sizes_mb:
        nbytes = size_mb * 2**20
        per = nbytes // TENSORS // 4
        state = {f"w{i}": torch.randn(per) for i in range(TENSORS)}
        targets = {k: torch.zeros_like(v) for k, v in state.items()}
        ceiling = memcpy_gbps(nbytes, args.repeats + 2)
        runs = []
        for _ in range(args.repeats + 1):  # the first one warms the store and the targets
            version += 1
            runs.append(sync_once(publisher, service, state, targets, version))
        assert all(torch.equal(targets[k], state[k]) for k in state)
        med = {k: float(np.median([r[k] for r in runs[1:]])) for k in runs[0]}
        gbps = nbytes / med["total_s"] / 1e9
        rows.append({"size_mb": size_mb, "memcpy_gbps": ceiling, "sync_gbps": gbps, "ratio": gbps / ceiling, **med})
        print(f"{size_mb:6d} MB  memcpy {ceiling:6.2f} GB/s  sync {gbps:6.2f} GB/s  ratio {gbps / ceiling:5.1%}  "
              f"(publish {med['publish_s'] * 1e3:8.1f} ms, fetch {med['fetch_s'] * 1e3:6.1f} ms, "
              f"load {med['load_s'] * 1e3:8.1f} ms)", flush=True)
        del state, targets
    ray.shutdown()
    print("\n| payload | memcpy GB/s | publish→fetch→load GB/s | ratio | publish ms | fetch ms | load ms |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['size_mb']} MB | {r['memcpy_gbps']:.2f} | {r['sync_gbps']:.2f} | {r['ratio']:.0%} | "
              f"{r['publish_s'] * 1e3:.1f} | {r['fetch_s'] * 1e3:.1f} | {r['load_s'] * 1e3:.1f} |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
