"""An explorer holds one transformer, whatever the weight-sync codec, and ranks as before.

A real Explorer, built in this process as its actor builds it, fed by a real weight-sync service (an actor
of the local Ray) with one snapshot of the single-process trainer's sampling policy in each codec (the lora one
with its adapters moved off their initial values, so the merge changes the weights). The distinct tensor
storages it holds are counted: one transformer (the engine is the policy's own), the text encoders and, for
lora, a copy of exactly the adapted layers' weights. Its ranked group is bitwise the one the old arrangement
gives: the policy's transformer kept beside a quantized copy, a lora snapshot merged onto it. (Explorer actors
in other processes reproduce the single process bit for bit in tests/cluster/test_cluster.py; an actor here
would add only its start, seconds of imports.)
"""

from __future__ import annotations

import pytest
import torch
from tiny import tiny_config
from torch import nn

from actors.explorer import Explorer
from diffusion.embedded.data import prompt_for
from diffusion.explore import ExploreEngine
from diffusion.loading import load_policy_from_config
from diffusion.noise import candidate_seeds
from learner.rollouts import exploration_sampling, explore_group
from learner.trainer import Trainer
from rewards import build_reward_from_config
from weight_sync.codecs import decode, encode
from weight_sync.publisher import WeightPublisher
from weight_sync.service import start_services, stop_services
from weight_sync.subscriber import WeightSubscriber

pytestmark = [pytest.mark.ray]

CONFIG = tiny_config(ray=True)
PROMPT = prompt_for(3)
# The embedded transformer's LoRA targets (the family's): the 8 attention projections of its 4 blocks of width
# 64, less block 3's to_add_out; fp32.
ADAPTED = 4 * 8 - 1
LORA_BASE_BYTES = ADAPTED * 64 * 64 * 4


@pytest.fixture(scope="module")
def snapshots() -> dict[str, tuple[dict[str, torch.Tensor], dict]]:
    """codec → (the state the learner publishes, meta), as `actors.learner.Learner.publish` builds it."""
    trainer = Trainer(CONFIG)
    g = torch.Generator().manual_seed(0)
    adapters = {k: v.detach() + 0.01 * torch.randn(v.shape, generator=g)
                for k, v in trainer.state.old_parameters().items()}
    weights = trainer.sampling_weights()
    return {"dense": (weights, {}), "nvfp4": (weights, {}),
            "lora": (adapters, {"lora_scale": trainer.state.lora_scale})}


def storages(tensors) -> dict[int, int]:
    """Each distinct storage behind `tensors`: its address → its bytes."""
    return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}


def module_tensors(modules) -> list[torch.Tensor]:
    return [t for m in modules if isinstance(m, nn.Module) for t in (*m.parameters(), *m.buffers())]


def census(explorer: Explorer) -> dict:
    """What the explorer holds: every storage of its policy's modules and its subscriber's LoRA base, and whether
    its policy's transformer is its engine's module."""
    base = explorer.subscriber.base or {}
    held = storages([*module_tensors(explorer.policy.components.values()), *base.values()])
    return {"one_module": explorer.policy.transformer is explorer.engine.module, "held": sum(held.values()),
            "base": sum(storages(base.values()).values()), "base_keys": sorted(base),
            "base_shared_with_engine": bool(storages(base.values()).keys()
                                            & storages(module_tensors([explorer.engine.module])).keys())}


def old_arrangement(state: dict[str, torch.Tensor], codec: str, meta: dict, quantize) -> tuple:
    """The explorer as it was: the policy's transformer beside the engine's quantized copy, the lora codec
    merging onto the policy's transformer; (policy, engine) after loading the snapshot."""
    policy = load_policy_from_config(CONFIG.model)
    engine = ExploreEngine(policy, CONFIG.explore)
    subscriber = WeightSubscriber(None, engine, base=policy.transformer.state_dict())
    arrays, manifest = encode(state, codec, version=1, quantize=quantize, meta=meta)
    subscriber.apply(decode(arrays, manifest), manifest)
    return policy, engine


@pytest.mark.parametrize("codec", ["dense", "nvfp4", "lora"])
def test_an_explorer_holds_one_transformer_and_ranks_as_with_two(codec, local_ray, snapshots):
    services = start_services(keep=2, tag=f"one-transformer-{codec}")
    state, meta = snapshots[codec]
    threads = torch.get_num_threads()  # the Explorer sets its process's torch threads (1), as the reference runs
    try:
        explorer = Explorer(CONFIG.model, CONFIG.explore, CONFIG.reward, services,
                            sampling=exploration_sampling(CONFIG), run_seed=CONFIG.run.seed,
                            candidates=CONFIG.prompts.candidates, prompt_source=CONFIG.prompts.source)
        quantize = explorer.engine.plan.quantized_weights
        assert len(quantize) == 8  # the 8 FFN Linears run in NVFP4: the nvfp4 codec packs them
        WeightPublisher(services, codec, quantize=quantize if codec == "nvfp4" else ()).publish(state, 1, meta=meta)
        group = explorer.explore(0, 0, PROMPT, 1)
        held = census(explorer)
        del explorer
        policy, engine = old_arrangement(state, codec, meta, quantize)
        reference = explore_group(policy, engine.module, build_reward_from_config(CONFIG.reward), iteration=0,
                                  slot=0, prompt=PROMPT, seeds=candidate_seeds(CONFIG.run.seed, 0, 0, 8),
                                  sampling=exploration_sampling(CONFIG), policy_version=1)
    finally:
        torch.set_num_threads(threads)
        stop_services(services)
    assert group.seeds == reference.seeds and torch.equal(group.proxy, reference.proxy)

    before = sum(storages(module_tensors([*policy.components.values(), engine.module])).values())
    transformer = sum(storages(module_tensors([policy.transformer])).values())
    base = LORA_BASE_BYTES if codec == "lora" else 0
    assert held["one_module"] and held["held"] == before - transformer + base
    assert held["base"] == base and not held["base_shared_with_engine"]
    if codec == "lora":
        assert held["base_keys"] == sorted(k.removesuffix(".lora_A.weight") + ".weight"
                                           for k in state if k.endswith(".lora_A.weight"))
        assert len(held["base_keys"]) == ADAPTED
