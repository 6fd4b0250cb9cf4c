"""The run's configuration tree, composed from the sections each package owns.

    config = load_config("configs/embedded.yaml", ["explore.precision=fp8", "run.seed=3"])

Invalid input fails here, before any model loads or any actor starts, with the field path, what
was given and what is allowed. A rule across sections is a function in one registry per layer: the
trainer's sections' in `learner.config.TRAINER_RULES`, those involving `cluster.*` in `CLUSTER_RULES` here.
"""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from learner.config import Problem, Rules, TrainerConfig
from weight_sync.codecs import Codec


class ActorResources(BaseModel):
    model_config = ConfigDict(extra="forbid")

    num_cpus: float = Field(1.0, ge=0)
    num_gpus: float = Field(0.0, ge=0, description="on a CPU-only cluster, 0 (logical resources stand in)")
    threads: int = Field(1, ge=1, description="torch CPU threads inside the actor")


class ExplorersConfig(ActorResources):
    count: int = Field(1, ge=1, description="explorer actors; scales independently of the learner")
    max_crashes: int = Field(3, ge=1, description="an explorer dying this many times in a row (no slot "
                             "finished in between) is a crash loop: the job ends, resumable")
    restart_timeout_s: float = Field(900.0, gt=0, description="how long a lost slot waits for a restarting "
                                     "explorer (model load included) before the job ends")
    max: int | None = Field(None, ge=1, description="the most explorers `cluster.control` may scale the job to "
                            "(None: count); a local Ray is started with room for them")
    join_timeout_s: float = Field(600.0, gt=0, description="an explorer added by `cluster.control` that is not "
                                  "placed and loaded within this is reported (naming the missing resources) "
                                  "and dropped")
    lost_after_s: float = Field(300.0, gt=0, description="an explorer unreachable this long (its node gone and "
                                "no room elsewhere: Ray keeps it restarting) is removed from the pool, which "
                                "grows back when room returns; above a model load, so one merely reloading "
                                "after a crash is not replaced")

    @property
    def limit(self) -> int:
        """The most explorers the job may run: `max`, or `count` when none is set."""
        return self.max if self.max is not None else self.count


class LearnerNetworkConfig(BaseModel):
    """Where the learner group's collectives (gloo, NCCL) connect across hosts (learner.collective_network)."""

    model_config = ConfigDict(extra="forbid")

    interface: str | None = Field(None, description="bind every rank's collectives to this interface (it must "
                                  "exist on every learner node); None: GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME "
                                  "if the job's environment sets them, else the interface carrying the node's "
                                  "Ray IP. NCCL_IB_* stay yours to set")
    subnet: str | None = Field(None, description="instead of a name: on each node, the interface with an address "
                               "in this network (e.g. 10.1.0.0/16), for nodes whose interfaces are named apart")

    @model_validator(mode="after")
    def _one_way(self) -> LearnerNetworkConfig:
        if self.interface is not None and self.subnet is not None:
            raise ValueError("set cluster.learner.network.interface or .subnet, not both")
        if self.subnet is not None:
            try:
                ipaddress.ip_network(self.subnet, strict=False)
            except ValueError as exc:
                raise ValueError(f"cluster.learner.network.subnet={self.subnet!r} is not a network: {exc} "
                                 "(write it as address/prefix, e.g. 10.1.0.0/16)") from None
        return self


class LearnerGroupConfig(ActorResources):
    count: int = Field(1, ge=1, description="learner ranks, one per GPU, in one torch.distributed group: each "
                       "regenerates and trains on its share of the slots (learner.data_parallel)")
    collective_timeout_s: float = Field(1800.0, gt=0, description="a learner collective waiting this long "
                                        "raises instead of hanging (the driver ends the job at once anyway); "
                                        "it also bounds the group's rendezvous and mesh connect")
    network: LearnerNetworkConfig = LearnerNetworkConfig()


class ScorersConfig(ActorResources):
    count: int = Field(0, ge=0, description="RewardScorer actors holding the reward models; 0: explorers and "
                       "the learner load the rewards beside their diffusion model")
    max_batch: int = Field(64, ge=1, description="a scorer closes a batch at this many images ...")
    max_wait_ms: float = Field(20.0, ge=0, description="... or when its first request has waited this long")


class ClusterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    address: str | None = Field(None, description="None: RAY_ADDRESS if set (ray job submit), else a local Ray")
    mode: Literal["sync", "async"] = Field("sync", description="async: explorers run ahead of the learner")
    max_policy_lag: int = Field(1, ge=0, description="async: drop groups explored more versions ago than this")
    codec: Codec | Literal["auto"] = Field(
        "auto", description="auto: nvfp4 for NVFP4 engines; lora ships only the sampling adapter")
    placement_strategy: Literal["PACK", "SPREAD"] = "PACK"
    stream_regeneration: bool = Field(True, description="the learner regenerates a slot's kept seeds as soon as "
                                      "its ranked group arrives, while the other slots are explored (sol_rl)")
    explorers: ExplorersConfig = ExplorersConfig()
    learner: LearnerGroupConfig = LearnerGroupConfig()
    scorers: ScorersConfig = ScorersConfig()

    def bundles(self) -> list[dict[str, float]]:
        """The job's placement-group bundles in actor order: each learner rank, each explorer, each scorer."""
        actors = ([self.learner] * self.learner.count + [self.explorers] * self.explorers.count
                  + [self.scorers] * self.scorers.count)
        return [{"CPU": a.num_cpus, "GPU": a.num_gpus} for a in actors]

    def total(self, resource: str) -> float:
        """What the job's bundles need of `resource` ("CPU" or "GPU") in all."""
        return sum(bundle[resource] for bundle in self.bundles())


class SolRLConfig(TrainerConfig):
    """The whole run: the trainer's sections plus the cluster's. Validation checks the trainer's rules
    (`learner.config.TRAINER_RULES`), then `CLUSTER_RULES`: the first broken one is the error."""

    model_config = ConfigDict(extra="forbid")

    cluster: ClusterConfig = ClusterConfig()

    @model_validator(mode="after")
    def _check_cluster_rules(self) -> SolRLConfig:
        CLUSTER_RULES.enforce(self)
        return self


# ---- the rules that involve the cluster's section, in the order they are checked -----------------------
CLUSTER_RULES: Rules[SolRLConfig] = Rules()


@CLUSTER_RULES.rule
def _explorers_max_covers_count(config: SolRLConfig) -> Problem | None:
    explorers = config.cluster.explorers
    if explorers.max is not None and explorers.max < explorers.count:
        return ("cluster.explorers.max", "cluster.explorers.count"), (
            f"cluster.explorers.max ({explorers.max}) must be >= cluster.explorers.count ({explorers.count}): it "
            "is the most explorers cluster.control may scale to; raise it or leave it unset (= count)")
    return None


@CLUSTER_RULES.rule
def _learner_ranks_get_whole_slots(config: SolRLConfig) -> Problem | None:
    count, per_iteration = config.cluster.learner.count, config.prompts.per_iteration
    if count > per_iteration:
        return ("cluster.learner.count", "prompts.per_iteration"), (
            f"cluster.learner.count ({count}) must be <= prompts.per_iteration "
            f"({per_iteration}): each learner rank trains on whole prompt slots; lower the count or raise "
            "prompts.per_iteration"
        )
    return None


@CLUSTER_RULES.rule
def _lora_codec_needs_lora_training(config: SolRLConfig) -> Problem | None:
    if config.cluster.codec == "lora" and config.training.mode != "lora":
        return ("cluster.codec", "training.mode"), (
            f"cluster.codec (lora) needs training.mode = lora (given {config.training.mode}): the lora codec ships "
            "only the sampling adapter, and full training has none; set cluster.codec=auto or training.mode=lora"
        )
    return None
