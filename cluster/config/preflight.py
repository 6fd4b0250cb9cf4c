"""Checks of the user's inputs (the config's fields and rules, files, folders) that run before Ray starts.

`check_inputs` is the one pass, in stages: the config validated again (`cluster.config.loading.revalidate`: a
config built with `model_copy(update=...)` skipped its validators), then the inputs it names (prompt sets,
logging extras, reward options and files, each prompt set against the rewards, the model folder last). Hub
repo ids are resolved on the way (`cluster.config.hub_sources`: the rewards' before their files are checked,
the model's last, so a bad prompt file fails before a multi-GB download), and the pass returns the config with
local folders in their place: what the actors get. `cluster.launch` runs it once per launch, in its resolve;
`cluster.check` runs it when it is its own command.

Prompt sets are checked against the rewards that will score them (`Reward.check_prompts`): a digit reward
needs a digit named in each prompt, ocr a quoted text, geneval each prompt's metadata.

Each would otherwise surface only once the actors have loaded, at the bottom of an ActorDiedError. Only
safetensors headers and small text files are read here, never weights, so a multi-GB model folder
costs about as much to check as importing diffusers and transformers (to look its classes up).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from cluster.config.hub_sources import Source, fetch_hint, model_source, prompt_sources, reward_sources, with_sources
from cluster.config.loading import ConfigError, one_line, revalidate
from cluster.config.schema import SolRLConfig
from diffusion.loading import check_model_folder, check_safetensors
from diffusion.prompts import PromptSet, load_prompt_set
from learner.experiment_log import missing_extras
from rewards.base import missing_files, reward_class


def _load_prompt_sets(config: SolRLConfig) -> dict[str, tuple[str, PromptSet]]:
    """Each prompt set loads: field → (its source, the set), the training set and the held-out one."""
    prompts, sets = config.prompts, {}
    for field, source, heldout in (("prompts.source", prompts.source, False),
                                   ("prompts.eval_source", prompts.eval_source, True)):
        try:
            sets[field] = source, load_prompt_set(source, heldout=heldout)
        except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
            raise ConfigError(one_line(f"{field}: {exc}")) from None
    return sets


def _check_scorable(config: SolRLConfig, sets: dict[str, tuple[str, PromptSet]]) -> None:
    """Every configured reward can score each prompt set (`Reward.check_prompts`, on the texts and the
    metadata the reward will be handed), embedded included. After the reward's own options and files:
    a reward that cannot be built at all is the first thing to fix."""
    for field, (source, prompt_set) in sets.items():
        for name in config.reward.weights:
            try:
                reward_class(name).check_prompts(prompt_set.texts, prompt_set.metadata_of(prompt_set.texts))
            except ValueError as exc:
                raise ConfigError(one_line(
                    f"{field}: the {name} reward cannot score the prompts of {source!r}: {exc}; give {field} a prompt "
                    f"set it can score, or choose another reward (reward.weights)")) from None


@dataclass(frozen=True)
class Checked:
    """What the preflight passed: the config with hub ids resolved to local folders, where each came from, and
    notes for the log (accepted but worth saying)."""

    config: SolRLConfig
    sources: list[Source] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)


def check_model(config: SolRLConfig) -> tuple[SolRLConfig, Source | None]:
    """The model folder checked as the loader will read it, a hub id resolved first: (the config with the local
    folder, its source or None). A file missing from a hub snapshot comes with the download command."""
    if config.model.path == "embedded":
        return config, None  # committed with the repository, and loaded by the test suite
    source = model_source(config)
    config = with_sources(config, [source] if source else [])
    try:
        check_model_folder(config.model.folder())
    except (OSError, ValueError, NotImplementedError) as exc:
        given = f"{source.ref}: " if source else ""
        raise ConfigError(one_line(f"model.path: {given}{exc}{fetch_hint([source] if source else [], 'model')}")) \
            from None
    return config, source


def _check_reward_files(config: SolRLConfig, sources: list[Source]) -> None:
    """Every configured reward model's weight files, by the reward's own list (`Reward.required_files`)."""
    for name in config.reward.weights:
        options = config.reward.options.get(name, {})
        try:
            missing = missing_files(reward_class(name).required_files(**options))
        except (TypeError, ValueError) as exc:  # a required option left out, or a bad one
            raise ConfigError(one_line(f"reward.options.{name}: {exc}")) from None
        if missing:
            files = "; ".join(f"{file.path} (from {file.source})" for file in missing)
            raise ConfigError(f"reward.options.{name}: missing {files}{fetch_hint(sources, f'reward.options.{name}.')}")
        for file in reward_class(name).required_files(**options):
            try:  # headers and small text files only: whole, parseable, without reading weights
                if file.path.suffix == ".safetensors":
                    check_safetensors(file.path)
                elif file.path.suffix == ".json":
                    try:
                        json.loads(file.path.read_text(encoding="utf-8"))
                    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
                        raise ValueError(f"{file.path} is not JSON ({exc}); copy or download it again") from None
            except (OSError, ValueError) as exc:
                raise ConfigError(one_line(f"reward.options.{name}: {exc} (from {file.source})")) from None


def _check_reward(config: SolRLConfig, notes: list[str], sources: list[Source]) -> None:
    for name in sorted(set(config.reward.options) - set(config.reward.weights)):
        notes.append(f"reward.options.{name} is ignored: {name} is not in reward.weights")
    for name in ("digit_alignment", "digit_margin"):  # the classifier's folder, its format too: a rebuild fixes it
        folder = config.reward.options.get(name, {}).get("path")
        if folder is not None and name in config.reward.weights:
            _check_classifier_folder(f"reward.options.{name}.path", Path(folder))
    _check_reward_files(config, sources)


def _check_classifier_folder(field: str, path: Path) -> None:
    from rewards.digit_classifier import CONFIG_FILE, FORMAT, REBUILD_COMMAND, WEIGHTS_FILE

    if not path.is_dir():
        what = "is a file" if path.exists() else "does not exist"
        raise ConfigError(f"{field}: {path} {what}; name the folder holding {CONFIG_FILE} and {WEIGHTS_FILE} "
                          f"(null: the committed classifier), or build one with `{REBUILD_COMMAND} --out {path}`")
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (path / name).is_file():
            raise ConfigError(f"{field}: {path} has no {name}; rebuild it with `{REBUILD_COMMAND} --out {path}`")
    try:
        saved = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
        fmt = saved.get("format") if isinstance(saved, dict) else None
        if fmt != FORMAT:
            raise ValueError(f"{path / CONFIG_FILE} is not a {FORMAT} config (format {fmt!r})")
        check_safetensors(path / WEIGHTS_FILE)
    except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ConfigError(one_line(f"{field}: {exc}")) from None


def _selection_notes(config: SolRLConfig) -> list[str]:
    keep = config.prompts.keep
    # keep == candidates keeps every seed: there is no split to speak of.
    if keep % 2 and keep < config.prompts.candidates and config.learner.selection == "best_worst":
        return [f"prompts.keep={keep} is odd: best_worst keeps the {keep // 2} best and {keep - keep // 2} worst "
                "seeds per prompt (as the official code)"]
    return []


def check_inputs(config: SolRLConfig) -> Checked:
    """Raise ConfigError (one line: file/field, what is wrong, the fix) on the first bad input; return the
    config with its hub ids resolved, their sources, and notes for the log."""
    revalidate(config)  # stage 1: the fields and rules (a loaded config passes; one from model_copy may not)
    prompts = prompt_sources(config)  # stage 2: the files and packages it names, hub files fetched first
    config = with_sources(config, prompts)
    sets = _load_prompt_sets(config)
    missing = missing_extras(config.logging)  # W&B / TensorBoard asked for but not installed
    if missing:
        raise ConfigError(missing[0])
    notes: list[str] = []
    sources = reward_sources(config)
    config = with_sources(config, sources)
    sources = prompts + sources
    _check_reward(config, notes, sources)
    _check_scorable(config, sets)
    config, model = check_model(config)  # last: the only check that may import diffusers and transformers
    return Checked(config, sources + ([model] if model else []), notes + _selection_notes(config))
