"""Weight-sync bandwidth: publish → fetch → load, both paths, against this machine's memcpy, in one run.

    python -m bench.weight_sync [--sizes-mb 1,16,128,1024] [--repeats 3] [--iteration-s 427] --json FILE

For each payload size: a state of 16 float32 tensors is published from an actor exactly as the learner
does, fetched by a reader and loaded into preallocated, already-touched tensors, through
- `store`: the object store (the node's WeightSyncService pulls the snapshot and owns it: one
  serialization into the store; the reader maps it zero-copy, decodes and copies),
- `shm`: the node's shared-memory region (the learner writes it once; the reader decodes straight from
  the mapping into the tensors, then checks the region's sequence number),
without checksums, and the shm path also with CRC-32 checksums written and verified.
Each size first runs a few unmeasured syncs, so every configuration meets warmed memory.
The ceiling is one copy between preallocated touched tensors with the same primitive (torch copy_);
both paths make two copies (into the store or region, out into the engine), so 50% of it is what the
design can reach. Medians over repeats. Then the modelled sync share of an SD3.5-L iteration for its
two payloads (`PAYLOADS`), at the rate measured for the nearest size.
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

TENSORS = 16
CONFIGS = (("store", False), ("shm", False), ("shm", True))
# SD3.5-L transformer (8.146 B parameters): 38 joint blocks of width d = 2432, each with 36·d² in Linears
# (q, k, v, out, 4d MLP, 6d adaLN, for the image and the text stream) → ≈ 8.09 B quantized, 0.06 B not.
# NVFP4 is 4 bits + one E4M3 scale per 16 elements = 0.5625 B per element; the rest travels as bf16.
# LoRA (the preset: rank 32 on the 8 attention projections of each block, 303 Linears of d × d, fp32):
# 303 · 32 · 2d parameters · 4 B.
PAYLOADS = {
    "sd35_large lora r32 (fp32 adapters)": 303 * 32 * 2 * 2432 * 4,
    "sd35_large dense nvfp4": int(8.09e9 * 0.5625 + 0.056e9 * 2),
}


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


_regions: dict[str, Region] = {}


def sync_once(source, service, targets, version: int, verify: bool) -> dict[str, float]:
    t0 = time.perf_counter()
    ray.get(source.publish.remote(version))
    t1 = time.perf_counter()
    _, manifest, refs = ray.get(service.latest.remote(version - 1))

    def load(manifest: dict, arrays: dict) -> None:
        for name, tensor in decode(arrays, Manifest.from_json(manifest), verify=verify).items():
            targets[name].copy_(tensor)

    if "shm" in manifest:  # what WeightSubscriber does: decode from the mapping, then check the sequence
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes-mb", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16, 128, 1024])
    parser.add_argument("--repeats", type=int, default=3)
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
        nbytes = size_mb * 2**20
        ceiling = memcpy_gbps(nbytes, args.repeats + 2)
        for path, checksums in CONFIGS:
            # A new size's first snapshots land in fresh shared memory (page faults, arena growth): unwarmed,
            # whichever configuration ran first looked ~9× slower. The first runs are not measured.
            source = ray.remote(Source).options(max_concurrency=2, num_cpus=0).remote(
                services, nbytes, checksums, path == "shm")
            targets = {f"w{i}": torch.zeros(nbytes // TENSORS // 4) for i in range(TENSORS)}
            runs = []
            for _ in range(args.repeats + 3):
                version += 1
                runs.append(sync_once(source, service, targets, version, verify=checksums))
            assert torch.equal(targets["w3"], ray.get(source.tensor.remote("w3")))
            ray.kill(source)
            med = {k: float(np.median([r[k] for r in runs[3:]])) for k in runs[0]}
            gbps = nbytes / med["total_s"] / 1e9
            rows.append({"size_mb": size_mb, "path": path, "checksums": checksums, "memcpy_gbps": ceiling,
                         "sync_gbps": gbps, "ratio": gbps / ceiling, **med})
            print(f"{size_mb:6d} MB  {path:5}  checksums {checksums!s:5}  memcpy {ceiling:6.2f} GB/s  sync "
                  f"{gbps:6.2f} GB/s  ratio {gbps / ceiling:5.1%}  (publish {med['publish_s'] * 1e3:7.1f} ms, "
                  f"fetch {med['fetch_s'] * 1e3:5.1f} ms, load {med['load_s'] * 1e3:7.1f} ms)", flush=True)
            del targets
    for region in _regions.values():
        region.close()
    stop_services(services)
    ray.shutdown()
    print("\n| payload | path | checksums | memcpy GB/s | publish→fetch→load GB/s | ratio | publish ms | fetch ms "
          "| load ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['size_mb']} MB | {r['path']} | {'yes' if r['checksums'] else 'no'} | {r['memcpy_gbps']:.2f} | "
              f"{r['sync_gbps']:.2f} | {r['ratio']:.0%} | "
              f"{r['publish_s'] * 1e3:.1f} | {r['fetch_s'] * 1e3:.1f} | {r['load_s'] * 1e3:.1f} |")
    model = []
    print(f"\n| modelled payload | MB | path | sync s | share of a {args.iteration_s:.0f} s iteration |")
    print("|---|---|---|---|---|")
    for label, nbytes in PAYLOADS.items():
        nearest = min(args.sizes_mb, key=lambda mb: abs(np.log(mb * 2**20 / nbytes)))
        for path in ("store", "shm"):
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
