"""The run's configuration tree, composed from the sections each package owns.

    config = load_config("configs/embedded.yaml", ["explore.precision=fp8", "run.seed=3"])

Invalid input fails here, before any model loads or any actor starts, with the field path, what
was given and what is allowed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from learner.config import RULE_ERROR, TrainerConfig
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

    @property
    def limit(self) -> int:
        """The most explorers the job may run: `max`, or `count` when none is set."""
        return self.max if self.max is not None else self.count


class LearnerGroupConfig(ActorResources):
    count: int = Field(1, ge=1, description="learner ranks, one per GPU, in one torch.distributed group: each "
                       "regenerates and trains on its share of the slots (learner.data_parallel)")
    collective_timeout_s: float = Field(1800.0, gt=0, description="a learner collective waiting this long "
                                        "raises instead of hanging (the driver ends the job at once anyway)")


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
    """The whole run: the trainer's sections plus the cluster's."""

    model_config = ConfigDict(extra="forbid")

    cluster: ClusterConfig = ClusterConfig()

    @model_validator(mode="after")
    def _check_shapes(self) -> SolRLConfig:
        problem = cross_field_problem(self)
        if problem is not None:
            fields, message = problem
            # A custom error keeps the message as written (no "Value error, " prefix) and carries the
            # fields, so the message can point at the preset line that set them.
            raise PydanticCustomError(RULE_ERROR, "{message}", {"message": message, "fields": fields})
        return self


def cross_field_problem(config: SolRLConfig) -> tuple[tuple[str, ...], str] | None:
    """The first rule across sections that `config` breaks: (the fields involved, a one-line message)."""
    p, training, codec = config.prompts, config.training, config.cluster.codec
    if p.keep > p.candidates:
        return ("prompts.keep", "prompts.candidates"), (
            f"prompts.keep ({p.keep}) must be <= prompts.candidates ({p.candidates}): "
            "keep is how many of the candidates are regenerated"
        )
    if config.learner.objective == "art" and config.learner.decay.type != 0:
        return ("learner.objective", "learner.decay.type"), (
            f"learner.objective (art) needs learner.decay.type = 0 (given {config.learner.decay.type}): the "
            "target, the trust region and the restoration all refer to the policy at the iteration's start, "
            "which must be the sampling policy (ART replaces the EMA-lagged sampler); set learner.decay.type=0"
        )
    explore = config.explore
    if explore.schedule == "halving":
        if not explore.halving_steps < explore.steps:
            return ("explore.halving_steps", "explore.steps"), (
                f"explore.halving_steps ({explore.halving_steps}) must be < explore.steps ({explore.steps}): the "
                "cut comes before the pool finishes; lower halving_steps or use explore.schedule=fixed")
        if not p.keep <= explore.halving_survivors <= p.candidates:
            return ("explore.halving_survivors", "prompts.keep", "prompts.candidates"), (
                f"explore.halving_survivors ({explore.halving_survivors}) must lie between prompts.keep ({p.keep}) "
                f"and prompts.candidates ({p.candidates}): the survivors are what selection picks from")
        if config.learner.selection != "best_worst" or config.learner.algorithm != "sol_rl":
            return ("explore.schedule", "learner.selection", "learner.algorithm"), (
                f"explore.schedule (halving) needs learner.algorithm = sol_rl and learner.selection = best_worst "
                f"(given {config.learner.algorithm}, {config.learner.selection}): it keeps the two ends of the "
                "ranking, which only best_worst selection of a low-precision pool uses")
    if config.learner.objective == "flow_grpo" and config.learner.decay.type != 0:
        return ("learner.objective", "learner.decay.type"), (
            f"learner.objective (flow_grpo) needs learner.decay.type = 0 (given {config.learner.decay.type}): "
            "PPO's ratio compares θ with the policy that sampled, which an EMA-lagged θ_old is not; set "
            "learner.decay.type=0"
        )
    if config.learner.art.pairwise and p.keep != 2:
        return ("learner.art.pairwise", "prompts.keep"), (
            f"learner.art.pairwise (true) needs prompts.keep = 2 (given {p.keep}): pairwise scores compare one "
            "winner with one loser per prompt; set prompts.keep=2 or learner.art.pairwise=false"
        )
    explorers = config.cluster.explorers
    if explorers.max is not None and explorers.max < explorers.count:
        return ("cluster.explorers.max", "cluster.explorers.count"), (
            f"cluster.explorers.max ({explorers.max}) must be >= cluster.explorers.count ({explorers.count}): it "
            "is the most explorers cluster.control may scale to; raise it or leave it unset (= count)")
    if config.cluster.learner.count > p.per_iteration:
        return ("cluster.learner.count", "prompts.per_iteration"), (
            f"cluster.learner.count ({config.cluster.learner.count}) must be <= prompts.per_iteration "
            f"({p.per_iteration}): each learner rank trains on whole prompt slots; lower the count or raise "
            "prompts.per_iteration"
        )
    if codec == "lora" and training.mode != "lora":
        return ("cluster.codec", "training.mode"), (
            f"cluster.codec (lora) needs training.mode = lora (given {training.mode}): the lora codec ships only "
            "the sampling adapter, and full training has none; set cluster.codec=auto or training.mode=lora"
        )
    return None


def check_cross_fields(config: SolRLConfig) -> None:
    """Raise ConfigError on a broken cross-section rule; for configs built without validation
    (`model_copy(update=...)` skips validators)."""
    problem = cross_field_problem(config)
    if problem is not None:
        raise ConfigError(problem[1])


class ConfigError(ValueError):
    """A configuration problem, stated with the field path and the fix."""


def apply_override(tree: dict[str, Any], override: str) -> None:
    if "=" not in override:
        raise ConfigError(f"--set {override!r}: write it as key.path=value, e.g. explore.precision=fp8")
    key, raw = override.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {override}: {_yaml_problem(exc, with_lines=False)[0]}; "
                          "quote the value or fix its syntax") from None
    node = tree
    parts = key.strip().split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {override!r}: {part!r} is a value, not a section")
        node = child
    node[parts[-1]] = value


KeyPath = tuple[str, ...]
Locate = Callable[[KeyPath, bool], str | None]


def one_line(text: str) -> str:
    """A message as one line: user errors are printed as a single `error:` line."""
    return " ".join(text.split())


def _yaml_problem(exc: yaml.YAMLError, *, with_lines: bool) -> tuple[str, yaml.Mark | None]:
    """The parser's complaint in one line, and where it is. Its str() spans several lines and names
    `<unicode string>`, which tells a user nothing."""
    if isinstance(exc, yaml.MarkedYAMLError) and (exc.problem or exc.context):
        problem = exc.problem or exc.context or ""
        if exc.problem and exc.context:
            started = exc.context_mark
            at = f" from line {started.line + 1}" if with_lines and started is not None else ""
            problem = f"{exc.problem} ({exc.context}{at})"
        return one_line(problem), exc.problem_mark
    return one_line(str(exc).splitlines()[0] if str(exc) else type(exc).__name__), None


def _key_lines(node: yaml.Node | None, prefix: KeyPath = ()) -> dict[KeyPath, int]:
    """The 1-based line of every key (and list item) of a composed YAML document, by key path."""
    lines: dict[KeyPath, int] = {}
    if isinstance(node, yaml.MappingNode):
        children = [((*prefix, str(k.value)), k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode)]
    elif isinstance(node, yaml.SequenceNode):
        children = [((*prefix, str(i)), item, item) for i, item in enumerate(node.value)]
    else:
        return lines
    for path, marked, value in children:
        lines[path] = marked.start_mark.line + 1
        lines.update(_key_lines(value, path))
    return lines


def _read_config_file(path: str | Path) -> tuple[dict[str, Any], dict[KeyPath, int]]:
    """A preset's tree and the line of each of its keys; every problem is a one-line ConfigError."""
    file = Path(path)
    if file.is_dir():
        raise ConfigError(f"config file {file} is a directory; name a YAML preset, e.g. configs/embedded.yaml")
    if not file.is_file():
        raise ConfigError(f"config file {file} does not exist; presets live in configs/")
    data = file.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"config file {file} is not UTF-8 text (byte 0x{data[exc.start]:02x} at line {line}); "
                          "save it as UTF-8") from None
    # One parse gives both the node graph (for line numbers) and the data, as yaml.safe_load would.
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        tree = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        problem, mark = _yaml_problem(exc, with_lines=True)
        where = f"{file} line {mark.line + 1}, column {mark.column + 1}" if mark is not None else str(file)
        raise ConfigError(f"{where}: {problem}; fix the YAML syntax there") from None
    finally:
        loader.dispose()
    if tree is None:  # an empty file, or only comments: the defaults
        return {}, {}
    if not isinstance(tree, dict):
        raise ConfigError(f"{file}: the top level must be a mapping of sections (given a {type(tree).__name__})")
    return tree, _key_lines(node)


def _locator(file: str | Path, lines: dict[KeyPath, int], overrides: Sequence[str]) -> Locate:
    """Where a field's value came from: 'FILE line N' for a preset key, None for a --set value (the
    message already names the field the user typed) or a default."""
    overridden = [tuple(o.split("=", 1)[0].strip().split(".")) for o in overrides if "=" in o]

    def locate(path: KeyPath, exact: bool) -> str | None:
        for key in overridden:
            n = min(len(key), len(path))
            if key[:n] == path[:n]:  # set by --set itself, or inside a section --set replaced
                return None
        # Not exact: pydantic may append a union member's tag to a path, so the longest prefix in the
        # preset is the key; a cross-field rule names its fields exactly.
        for end in range(len(path), len(path) - 1 if exact else 0, -1):
            if path[:end] in lines:
                return f"{file} line {lines[path[:end]]}"
        return None

    return locate


def _given(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _describe(error: ValidationError, locate: Locate | None = None) -> list[str]:
    """One line per problem: where (preset file and line, when known), the field, what is wrong."""
    lines = []
    for item in error.errors():
        loc: KeyPath = tuple(str(p) for p in item["loc"])
        path = ".".join(loc) or "(top level)"
        if item["type"] == RULE_ERROR:
            # The whole tree is the input here: the message names the fields and values instead.
            text = item["msg"]
            fields = [tuple(f.split(".")) for f in (item.get("ctx") or {}).get("fields", ())]
            where = next((w for w in (locate(f, True) for f in fields) if w), None) if locate else None
        else:
            if item["type"] == "extra_forbidden":
                text = f"{path}: unknown field (given {_given(item.get('input'))}); check the spelling against the docs"
            elif item["type"] == "missing" or not loc:
                text = f"{path}: {item['msg'].removeprefix('Value error, ')}"
            else:
                text = f"{path}: {item['msg'].removeprefix('Value error, ')} (given {_given(item.get('input'))})"
            where = locate(loc, False) if locate else None
        lines.append(one_line(f"{where}: {text}" if where else text))
    return lines


def _parse(tree: dict[str, Any], locate: Locate | None) -> SolRLConfig:
    try:
        return SolRLConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError("; ".join(_describe(exc, locate))) from None


def parse_config(tree: dict[str, Any]) -> SolRLConfig:
    """Validate a config tree; a ConfigError's message is one line (several problems joined by '; ')."""
    return _parse(tree, None)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> SolRLConfig:
    """Read a YAML preset (or the defaults), apply `key.path=value` overrides, validate.

    A resumed run's own config.yaml goes through here too, so its errors read the same."""
    overrides = list(overrides or [])
    tree: dict[str, Any] = {}
    lines: dict[KeyPath, int] = {}
    if path is not None:
        tree, lines = _read_config_file(path)
    for override in overrides:
        apply_override(tree, override)
    return _parse(tree, _locator(path, lines, overrides) if path is not None else None)
