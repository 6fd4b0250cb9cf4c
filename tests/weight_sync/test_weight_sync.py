"""Weight sync: codecs bit for bit, and the per-node service on a real local Ray cluster."""

from __future__ import annotations

import sys
import threading
import time

import pytest
import ray
import torch
from engines import quantize, quantized_layer_names, stand_in_policy

from diffusion.config import ExploreConfig
from diffusion.explore import ExploreEngine
from diffusion.lora import merge_lora
from diffusion.quant import load_weights, nvfp4_fake_quant
from weight_sync.codecs import CorruptSnapshot, Manifest, decode, encode, payload_bytes
from weight_sync.publisher import WeightPublisher
from weight_sync.service import WeightSyncService, start_services
from weight_sync.shm import Region
from weight_sync.subscriber import WeightSubscriber

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the Source actor below


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "a.weight": torch.randn(64, 48, generator=g),
        "a.bias": torch.randn(64, generator=g),
        "b.weight": torch.randn(32, 64, generator=g).to(torch.bfloat16),
        "steps": torch.arange(5),
    }


def test_dense_round_trip_is_exact_for_every_dtype():
    state = _state()
    arrays, manifest = encode(state, "dense", version=3)
    back = decode(arrays, Manifest.from_json(manifest.to_json()))
    assert back.keys() == state.keys()
    assert all(torch.equal(back[k], v) and back[k].dtype == v.dtype for k, v in state.items())


def test_nvfp4_decodes_to_the_engines_fake_quant_values():
    state = _state(1)
    arrays, manifest = encode(state, "nvfp4", version=1, quantize=["a.weight", "b.weight"])
    back = decode(arrays, manifest)
    assert torch.equal(back["a.weight"], nvfp4_fake_quant(state["a.weight"]))
    assert torch.equal(back["b.weight"], nvfp4_fake_quant(state["b.weight"]))
    assert torch.equal(back["a.bias"], state["a.bias"])
    dense_bytes = payload_bytes(encode(state, "dense", version=1)[0])
    assert payload_bytes(arrays) < 0.5 * dense_bytes  # 4.5 bits instead of 32/16


def test_checksums_catch_a_corrupted_or_missing_array():
    arrays, manifest = encode(_state(), "nvfp4", version=2, quantize=["a.weight"])
    broken = dict(arrays)
    broken["a.weight/codes"] = arrays["a.weight/codes"].copy()
    broken["a.weight/codes"][0, 0] ^= 0xFF
    with pytest.raises(CorruptSnapshot, match=r"v2: checksum mismatch for 'a\.weight'"):
        decode(broken, manifest)
    missing = {k: v for k, v in arrays.items() if k != "a.bias"}
    with pytest.raises(CorruptSnapshot, match=r"lacks 'a\.bias'"):
        decode(missing, manifest)


def test_engine_loaded_from_an_nvfp4_snapshot_equals_one_loaded_densely():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(48, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
    engine_a, engine_b = (quantize(model, "nvfp4", backend="project") for _ in range(2))
    new = {k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items()}
    names = [f"{n}.weight" for n in quantized_layer_names(engine_a)]
    load_weights(engine_a, new)
    arrays, manifest = encode(new, "nvfp4", version=1, quantize=names)
    load_weights(engine_b, decode(arrays, manifest), prequantized=names)
    x = torch.randn(5, 48)
    assert torch.equal(engine_a(x), engine_b(x))


def test_nvfp4_packs_a_1x1_conv_weight_as_the_engines_gemm_matrix():
    """A 1×1 conv runs as a Linear over channels: its [out, in, 1, 1] weight is quantized as the
    [out, in] matrix (blocks along in), and decodes to exactly the engine's fake-quantized weight."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(48, 32, 1), torch.nn.GELU(), torch.nn.Conv2d(32, 40, 1, bias=False))
    engine_a, engine_b = (quantize(model, "nvfp4", conv1x1=True, backend="project") for _ in range(2))
    names = [f"{n}.weight" for n in quantized_layer_names(engine_a)]
    assert names == ["0.weight", "2.weight"]
    new = {k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items()}
    arrays, manifest = encode(new, "nvfp4", version=1, quantize=names)
    back = decode(arrays, Manifest.from_json(manifest.to_json()))
    assert back["0.weight"].shape == (32, 48, 1, 1) and arrays["0.weight/scales"].shape == (32, 3)
    assert torch.equal(back["0.weight"], nvfp4_fake_quant(new["0.weight"].reshape(32, 48)).reshape(32, 48, 1, 1))
    load_weights(engine_a, new)
    load_weights(engine_b, back, prequantized=names)
    for name in ("0", "2"):
        assert torch.equal(engine_a.get_submodule(name).weight_fq, engine_b.get_submodule(name).weight_fq)
    x = torch.randn(2, 48, 3, 5)
    assert torch.equal(engine_a(x), engine_b(x))


def explore_engine(model: torch.nn.Module) -> ExploreEngine:
    """The explorer's engine of `model` (a stand-in policy: every Linear quantized, project backend)."""
    config = ExploreConfig(precision="nvfp4", backend="project", allow_emulation=True)
    return ExploreEngine(stand_in_policy(model), config)


def test_merge_lora_matches_the_definition():
    g = torch.Generator().manual_seed(0)
    base = {"l.weight": torch.randn(8, 6, generator=g)}
    adapters = {"l.lora_A.weight": torch.randn(2, 6, generator=g), "l.lora_B.weight": torch.randn(8, 2, generator=g)}
    merged = merge_lora(base, adapters, scale=2.0)
    torch.testing.assert_close(merged["l.weight"], base["l.weight"] + 2.0 * adapters["l.lora_B.weight"]
                               @ adapters["l.lora_A.weight"])


def _lora_snapshot(seed: int, layers: tuple[str, ...], shapes: dict[str, tuple[int, int]]):
    g = torch.Generator().manual_seed(seed)
    adapters = {}
    for layer in layers:
        out, inp = shapes[f"{layer}.weight"]
        adapters[f"{layer}.lora_A.weight"] = torch.randn(2, inp, generator=g)
        adapters[f"{layer}.lora_B.weight"] = torch.randn(out, 2, generator=g)
    arrays, manifest = encode(adapters, "lora", version=seed, meta={"lora_scale": 0.5})
    return adapters, decode(arrays, manifest), manifest


def test_a_lora_base_is_copied_from_the_engine_for_the_adapted_layers_only():
    """Without `base`, the first lora snapshot copies the engine's (still unmodified) weights of the layers it
    adapts, and every later snapshot merges onto those copies, not onto the previous merge."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))
    original = {k: v.clone() for k, v in model.state_dict().items()}
    engine = explore_engine(model)
    shapes = {k: tuple(v.shape) for k, v in original.items()}
    subscriber = WeightSubscriber(None, engine)
    for version in (1, 2):
        adapters, state, manifest = _lora_snapshot(version, ("2",), shapes)
        subscriber.apply(state, manifest)
        assert list(subscriber.base) == ["2.weight"] and torch.equal(subscriber.base["2.weight"], original["2.weight"])
        assert subscriber.base["2.weight"].data_ptr() != engine.module[2].weight.data_ptr()
        assert torch.equal(engine.module[2].weight, merge_lora(original, adapters, 0.5)["2.weight"])
        assert torch.equal(engine.module[0].weight, original["0.weight"])


def test_a_lora_snapshot_after_another_codec_is_refused_without_a_base():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 16))
    engine = explore_engine(model)
    subscriber = WeightSubscriber(None, engine)
    arrays, manifest = encode({k: v * 1.5 for k, v in model.state_dict().items()}, "dense", version=1)
    subscriber.apply(decode(arrays, manifest), manifest)
    _, state, manifest = _lora_snapshot(2, ("1",), {k: tuple(v.shape) for k, v in model.state_dict().items()})
    with pytest.raises(ValueError, match="after the engine loaded another snapshot: its base weights are gone"):
        subscriber.apply(state, manifest)


@pytest.mark.ray
def test_service_versions_are_monotonic_and_old_ones_are_released(local_ray):
    service = WeightSyncService(keep=2)
    for version in (1, 2, 3):
        arrays, manifest = encode(_state(version), "dense", version=version)
        assert service.publish(manifest.to_json(), arrays) == version
    assert service.publish(encode(_state(), "dense", version=2)[1].to_json(), {}) == 3  # stale: ignored
    assert service.stats()["versions"] == [2, 3]
    assert service.latest(after=3) == (3, None, [])


@pytest.mark.ray
def test_publish_fetch_and_restart_on_a_real_cluster(local_ray, restart_sync_service):
    services = start_services(keep=2, tag="restart")
    (node, service), = services.items()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 16))
    engine = explore_engine(model)
    names = engine.plan.quantized_weights
    assert names == ("0.weight", "1.weight")
    publisher = WeightPublisher(services, "nvfp4", quantize=names)
    subscriber = WeightSubscriber(service, engine)
    assert subscriber.poll() is None  # nothing published yet

    new = {k: v * 1.5 for k, v in model.state_dict().items()}
    info = publisher.publish(new, version=1)
    assert info["bytes"] > 0
    assert subscriber.poll()["version"] == 1 and subscriber.poll() is None
    assert torch.equal(engine.module[0].weight_fq, nvfp4_fake_quant(new["0.weight"]))

    restart_sync_service(service)  # the service restarts empty ...
    assert publisher.republish() == [node]  # ... and the learner republishes to it
    assert ray.get(service.version.remote()) == 1
    # a node's service only makes regions and hands out references: its process never imports torch
    assert ray.get(service.__ray_call__.remote(lambda _: sorted({"torch", "diffusion"} & set(sys.modules)))) == []


class Source:
    """Publishes the way the learner actor does: the services pull each snapshot from this actor."""

    def __init__(self, services, shm: bool = False) -> None:
        self.publisher = WeightPublisher(services, "dense", source=ray.get_runtime_context().current_actor, shm=shm)

    def publish(self, version: int) -> None:
        self.publisher.publish({f"w{i}": torch.full((256, 64), float(version) + i) for i in range(4)}, version)

    def snapshot(self, version: int):
        return self.publisher.snapshot(version)


@pytest.mark.ray
@pytest.mark.parametrize("shm", [False, True], ids=["object_store", "shared_memory"])
def test_concurrent_publish_and_fetch_never_tear(local_ray, shm):
    """Two readers fetch whole snapshots while an actor publishes 40 versions: every tensor of every
    snapshot read belongs to the version it claims, versions never go back, and each reader saw at
    least 10 different versions while the publishes ran (so it really read concurrently). Through shared
    memory, reads the writer overtook are retried (counted in `torn`), never handed out."""
    services = start_services(keep=2, tag=f"torn{int(shm)}")
    service = next(iter(services.values()))
    source = ray.remote(max_concurrency=2, num_cpus=0)(Source).remote(services, shm)
    torn = [0, 0]
    first, last = 100, 139
    errors: list[str] = []
    seen: list[set[int]] = [set(), set()]
    publishing = threading.Event()
    publishing.set()

    def reader(index: int) -> None:
        newest, region = -1, None
        while publishing.is_set():
            version, manifest, refs = ray.get(service.latest.remote(-1))
            if manifest is None:
                continue
            if "shm" in manifest:  # decode (verifying checksums) and copy out, then check the sequence
                if region is None or region.name != manifest["shm"]:
                    region = Region.attach(manifest["shm"])
                read = region.read(lambda m, a: {k: v.clone() for k, v in decode(a, Manifest.from_json(m)).items()})
                if read is None:
                    continue
                version, state = read
                torn[index] = region.torn
            else:
                state = decode(ray.get(refs[0]), Manifest.from_json(manifest))  # verifies every checksum
            expected = {f"w{i}": torch.full((256, 64), float(version) + i) for i in range(4)}
            if state.keys() != expected.keys() or not all(torch.equal(state[k], expected[k]) for k in expected):
                errors.append(f"v{version}: a snapshot mixing versions")
            if version < newest:
                errors.append(f"v{version} after v{newest}")
            newest = version
            if version < last:  # read while publishes were still to come
                seen[index].add(version)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    try:
        for version in range(first, last + 1):
            ray.get(source.publish.remote(version))
            time.sleep(0.05)  # room for the readers between publishes
    finally:
        publishing.clear()
        for t in threads:
            t.join()
    print(f"{'shared memory' if shm else 'object store'}: torn reads retried {torn}, versions seen "
          f"{[len(s) for s in seen]}")
    assert not errors, errors[:3]
    assert all(len(s) >= 10 for s in seen), [len(s) for s in seen]
    assert ray.get(service.version.remote()) == last
    assert ("shm" in ray.get(service.latest.remote(-1))[1]) == shm
    for actor in [source, *services.values()]:
        ray.kill(actor, no_restart=True)
