"""The low-precision explore engine of a policy: a quantized copy of its transformer.

    plan   = explore_plan(policy, config)        # what the engine is, without copying the model
    engine = ExploreEngine(policy, config)       # the quantized copy (in_place=True: no copy, see below)
    policy.sample(..., transformer=engine.module)
    engine.load(weights, prequantized=...)       # new policy weights, quantizers refreshed

The engine shares everything else with the policy (prompt cache, noise, samplers). Which layers run
quantized comes from the model family (Sol-RL's per-family skip lists, minimum sizes and 1×1 conv
switch) unless the config overrides ``skip``/``min_dim``/``conv1x1``; the rule itself is
:mod:`diffusion.quant.layer_rule`. ``engine.module`` runs each forward inside its backend's runtime
context (TE's FP4 autocast for ``te``), so no caller has to remember it.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from diffusion.config import ExploreConfig
from diffusion.device import module_device
from diffusion.policy import FlowPolicy
from diffusion.quant import (
    NVFP4_WEIGHT_PRECISIONS,
    Precision,
    build_engine,
    choose_engine,
    device_facts,
    engine_layers,
    load_weights,
)


@dataclass(frozen=True)
class ExplorePlan:
    """What an explore engine is: its precision, backend and quantized layers, and what that runs.

    ``quantized_weights`` are the ``state_dict`` keys (``"<layer>.weight"``) that the weight-sync
    ``nvfp4`` codec packs: those of every quantized layer when the precision's weights are NVFP4
    (``nvfp4``, ``nvfp4_w4a16``), none otherwise.
    """

    precision: Precision
    backend: str  # the resolved backend; "none" for precision "none" (a plain copy)
    linears: tuple[str, ...]  # Linears run quantized (after the backend's own filter, e.g. TE's dims)
    convs: tuple[str, ...]  # 1×1 convolutions run quantized
    quantized_weights: tuple[str, ...]
    emulated: bool = False  # fake quantization (or a reference kernel): fidelity, not speed
    summary: str = ""  # what runs, in words (diffusion.quant.backends.EngineChoice.summary)

    @property
    def layers(self) -> tuple[str, ...]:
        """Every quantized layer: the Linears, then the 1×1 convolutions."""
        return (*self.linears, *self.convs)


def explore_plan(policy: FlowPolicy, config: ExploreConfig) -> ExplorePlan:
    """The plan of ``ExploreEngine(policy, config)``: the family's skip list, minimum size and 1×1
    conv switch (``config.skip`` / ``config.min_dim`` / ``config.conv1x1`` override them), in the precision and on
    the backend :func:`~diffusion.quant.choose_engine` picks for the transformer's device (raises
    ``ValueError`` for a request that device can only emulate, unless ``config.allow_emulation``)."""
    transformer = policy.transformer
    choice = choose_engine(config.precision, config.backend, device_facts(module_device(transformer)),
                           allow_emulation=config.allow_emulation)
    if choice.precision == "none":
        return ExplorePlan("none", "none", (), (), (), summary=choice.summary)
    quant = policy.family.quant
    backend = choice.backend
    layers = engine_layers(
        transformer,
        backend,
        skip=tuple(quant.skip if config.skip is None else config.skip),
        min_dim=quant.min_dim if config.min_dim is None else config.min_dim,
        conv1x1=quant.conv1x1 if config.conv1x1 is None else config.conv1x1,
    )
    packed = choice.precision in NVFP4_WEIGHT_PRECISIONS
    return ExplorePlan(
        precision=choice.precision,
        backend=backend,
        linears=layers.linears,
        convs=layers.convs,
        quantized_weights=tuple(f"{name}.weight" for name in (*layers.linears, *layers.convs)) if packed else (),
        emulated=choice.emulated,
        summary=choice.summary,
    )


class ExploreEngine:
    """A quantized copy of ``policy.transformer`` built to :func:`explore_plan`'s plan.

    ``module`` is what samplers call (``policy.sample(..., transformer=engine.module)``); it has the
    transformer's ``state_dict`` keys. :meth:`load` takes new policy weights.

    ``in_place=True`` quantizes the policy's own transformer instead of a copy and hands the result back
    to the policy (``policy.transformer is engine.module`` afterwards): a process that samples only
    through the engine (an explorer) then holds one transformer, not two. Its values are those of the
    copy, bit for bit; the policy's high-precision transformer is gone, so only a process that never
    samples or trains with it may ask for this (the learner trains it, and keeps the default copy).
    """

    plan: ExplorePlan
    module: nn.Module

    def __init__(self, policy: FlowPolicy, config: ExploreConfig, *, in_place: bool = False) -> None:
        self.plan = explore_plan(policy, config)
        if self.plan.precision == "none":
            self.module = policy.transformer if in_place else copy.deepcopy(policy.transformer)
        else:
            self.module = build_engine(
                policy.transformer,
                self.plan.precision,
                self.plan.backend,
                linears=self.plan.linears,
                convs=self.plan.convs,
                in_place=in_place,
            )
        if in_place:
            policy.use_transformer(self.module)

    def load(
        self,
        state: Mapping[str, torch.Tensor | np.ndarray],
        *,
        strict: bool = True,
        prequantized: Collection[str] = (),
    ) -> None:
        """Copy ``state`` into the engine in place and refresh its quantizers (:func:`load_weights`);
        weights named in ``prequantized`` hold NVFP4 fake-quantized values and are used as they are."""
        load_weights(self.module, state, strict=strict, prequantized=prequantized)
