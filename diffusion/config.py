"""Settings of the diffusion core: which model, how the learner samples, how explorers sample, which prompts."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from diffusion.quant import Backend, PrecisionRequest
from diffusion.samplers import SigmaGrid, Solver

EMBEDDED_MODEL = Path(__file__).parent / "embedded" / "artifacts" / "model"


class ModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field("embedded", description="a diffusers-format model folder, a Hugging Face repo id "
                      "(org/name or org/name@revision: only what the pipeline loads is fetched, before Ray "
                      "starts; the cache alone with HF_HUB_OFFLINE=1), or 'embedded'")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="auto: bfloat16 on CUDA, float32 on CPU"
    )
    shift: float | None = Field(None, gt=0, description="time shift; None takes the scheduler config's")
    sigma_grid: SigmaGrid = Field("scheduler", description="the σ grid every sampler walks: scheduler (the "
                                  "folder's FlowMatchEuler grid with its shift, as the diffusers pipelines) or "
                                  "linspace (linspace(1, 0, steps + 1), unshifted: the official Sol-RL SANA "
                                  "recipe's; takes no shift)")
    resolution: int | None = Field(None, gt=0, description="pixels; None takes the transformer's sample size")
    guidance: float | None = Field(None, gt=0, description="distilled guidance of families that take it (FLUX); "
                                   "None: the family's default")
    offload_text_encoders: bool = Field(False, description="keep the text encoders on the CPU and move them "
                                        "to the model's device only while encoding new prompts (embeddings "
                                        "are cached per prompt); saves their memory on the GPU")
    sequential_decode: bool = Field(False, description="decode one latent at a time (bounds the VAE's "
                                    "activation memory at high resolution; the official Sol-RL option)")

    @model_validator(mode="after")
    def _linspace_is_unshifted(self) -> ModelConfig:
        if self.sigma_grid == "linspace" and self.shift is not None:
            raise ValueError(f"model.sigma_grid=linspace is unshifted, but model.shift is {self.shift}: remove "
                             "model.shift, or set model.sigma_grid=scheduler")
        return self

    def folder(self) -> Path:
        return EMBEDDED_MODEL if self.path == "embedded" else Path(self.path)


class SamplerConfig(BaseModel):
    """The high-precision sampler (the learner's regeneration, evaluation)."""

    model_config = ConfigDict(extra="forbid")

    solver: Solver = "euler"
    steps: int = Field(10, ge=1)
    cfg_scale: float = Field(1.0, ge=1.0)
    sde_noise_level: float = Field(0.7, gt=0, description="a of the flow_sde solver (Flow-GRPO's noise level), "
                                   "wherever it samples: a solver set to flow_sde, or the flow_grpo objective's "
                                   "rollouts")


SpreadRule = Literal["proportional", "median"]  # learner.rollouts.spread_pool_size


class ExploreConfig(BaseModel):
    """The low-precision explore engine and its sampler."""

    model_config = ConfigDict(extra="forbid")

    precision: PrecisionRequest = Field("auto", description="auto: the fastest format this GPU runs for real "
                                        "(NVFP4 with TE on Blackwell, FP8 with torchao on Hopper/Ada, BF16 on "
                                        "older GPUs; NVFP4 emulated on CPU, for fidelity); or nvfp4, nvfp4_w4a16, "
                                        "fp8 (scaled per row: a candidate's proxy is independent of its "
                                        "batchmates), fp8_tensor (one scale per tensor, torchao's faster mode), "
                                        "none")
    backend: Backend = "auto"
    allow_emulation: bool = Field(False, description="run an explicitly requested format this device can only "
                                  "emulate (fake quantization: slower than BF16, for fidelity studies)")
    solver: Solver | None = Field(None, description="None: the sampler's solver (the paper explores with the "
                                  "solver it regenerates with)")
    steps: int = Field(6, ge=1)
    schedule: Literal["fixed", "halving", "spread"] = Field(
        "fixed", description="fixed: every candidate takes every explore step (the paper); halving: successive "
        "halving, learner.rollouts.successive_halving; spread: each prompt's pool size from the spread of its "
        "first proxies, learner.rollouts.spread_explore (both this project's)")
    halving_steps: int = Field(2, ge=1, description="halving: the steps every candidate takes before the cut")
    halving_survivors: int = Field(48, ge=2, description="halving: candidates that finish (half best, half "
                                   "worst by the early proxy)")
    spread_first: int = Field(48, ge=2, description="spread: the first candidates every prompt explores; how "
                              "many more, from their proxies' std against the previous iteration's median std")
    spread_rule: SpreadRule = Field(
        "proportional", description="spread: proportional: (spread_first + N)/2 · std ÷ the previous "
        "iteration's median of the first chunks' std candidates, within [spread_first, N]; median: all N where "
        "the first chunk's std reaches that median, else the first chunk (bench.adaptive_explore: it selects "
        "worse than a uniform pool of its cost)")
    batch_size: int | None = Field(None, ge=1, description="candidates sampled per forward (None: a slot's N at "
                                   "once); bounds an explorer's activation memory")
    min_dim: int | None = Field(None, ge=0, description="None takes the model family's minimum")
    skip: list[str] | None = Field(None, description="module patterns kept in high precision; None: family's")
    conv1x1: bool | None = Field(None, description="also quantize 1×1 convolutions (run as Linears over "
                                 "channels); None: the family's (SANA true: diffusers' SANA holds as 1×1 convs the "
                                 "FFN that the official rule quantizes as Linears in its native model)")


class PromptConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: str = Field("embedded", description="'embedded' (the digit prompts); a text file (one prompt a line), "
                        "a .jsonl file (GenEval metadata), a .csv file (DrawBench); a flow_grpo dataset folder "
                        "(its train split); or hf://datasets/org/name[@revision]/file")
    eval_source: str = Field("embedded", description="held-out prompts: as `source` (a folder: its test split)")
    per_iteration: int = Field(8, ge=1, description="prompt slots per iteration")
    candidates: int = Field(96, ge=2, description="N: seeds explored per prompt")
    keep: int = Field(24, ge=2, description="K: seeds regenerated and trained on per prompt")
