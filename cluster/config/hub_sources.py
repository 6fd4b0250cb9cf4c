"""A config's Hugging Face repo ids, resolved to local paths: `model.path`, every reward's folder options, and
prompt files on the hub (`prompts.source: hf://datasets/org/name/file`).

Resolved once per launch, in the preflight (`cluster.config.preflight.check_inputs`), before Ray starts: the
actors get the resolved config (snapshot folders), config.yaml keeps the ids as given (a resume resolves them
again, from whatever cache it finds), and each `Source` (repo, commit, folder) is recorded in launches.jsonl
and named by the export's model card. Which files are fetched is decided by what will load them: a pipeline's
components (`diffusion.hub.pipeline_snapshot`), a reward's own file list (`Reward.required_files`).

A reward option takes a repo id when its name is `path` or ends in `_path` and the reward loads files from the
folder it names; options naming a single file (ocr's ONNX models) take local files only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.config.loading import ConfigError, one_line
from cluster.config.schema import SolRLConfig
from diffusion.hub import (
    HubRef,
    HubUnavailable,
    dataset_file,
    download_command,
    hub_ref,
    pipeline_snapshot,
    snapshot,
)
from rewards.base import reward_class

# Where a reward's file list is computed before its folder is known; never read (it does not exist).
_STAND_IN = Path("/solrl-hub-folder-stand-in")


@dataclass(frozen=True)
class Source:
    """One config field that named a hub repo, and what it resolved to."""

    field: str  # "model.path", "reward.options.pickscore.processor_path", "prompts.source"
    ref: HubRef
    folder: Path  # the snapshot: <cache>/models--org--name/snapshots/<commit>
    fetch: str  # the `hf download` command for exactly the files it needs
    file: str | None = None  # a file inside the snapshot (prompt files), or None: the field is the folder

    @property
    def path(self) -> Path:
        """What the field is set to: the snapshot folder, or the file in it."""
        return self.folder if self.file is None else self.folder / self.file

    def record(self) -> dict[str, str]:
        return {"field": self.field, "repo": self.ref.repo, "type": self.ref.kind,
                "revision": self.ref.revision or "main", "commit": self.folder.name, "path": str(self.path)}


def prompt_sources(config: SolRLConfig) -> list[Source]:
    """prompts.source / prompts.eval_source as hub files (`hf://datasets/org/name[@revision]/path`): fetched, or
    found in the cache offline."""
    sources = []
    prompts = config.prompts
    for field, value in (("prompts.source", prompts.source), ("prompts.eval_source", prompts.eval_source)):
        found = dataset_file(value)
        if found is None:
            continue
        ref, file = found
        fetch = download_command(ref, [file])
        try:
            folder = snapshot(ref, [file], fetch=fetch)
        except HubUnavailable as exc:
            raise ConfigError(one_line(f"{field}: {exc}")) from None
        if not (folder / file).is_file():
            raise ConfigError(f"{field}: {ref} has no {file} in the Hugging Face cache ({folder}); fetch it with "
                              f"`{fetch}`")
        sources.append(Source(field, ref, folder, fetch, file))
    return sources


def _folder_options(options: dict[str, Any]) -> dict[str, HubRef]:
    return {key: ref for key, value in options.items()
            if (key == "path" or key.endswith("_path")) and isinstance(value, str) and (ref := hub_ref(value))}


def reward_sources(config: SolRLConfig) -> list[Source]:
    """Each hub id among the configured rewards' folder options, fetched (or found in the cache) with the
    files the reward loads from that folder: `required_files` computed on stand-in folders gives their names."""
    sources = []
    for name in config.reward.weights:
        options = config.reward.options.get(name, {})
        hub = _folder_options(options)
        if not hub:
            continue
        stand_ins = {key: _STAND_IN / key for key in hub}
        try:
            files = [file.path for file in reward_class(name).required_files(**{**options, **stand_ins})]
        except (TypeError, ValueError) as exc:
            raise ConfigError(one_line(f"reward.options.{name}: {exc}")) from None
        for key, ref in hub.items():
            field, stand_in = f"reward.options.{name}.{key}", stand_ins[key]
            if stand_in in files:
                raise ConfigError(f"{field}: {ref} is a repo id, but {key} names a single file; download it "
                                  f"(`hf download {ref.repo} FILE`) and give the file's path")
            names = sorted(path.relative_to(stand_in).as_posix() for path in files if path.is_relative_to(stand_in))
            if not names:
                raise ConfigError(f"{field}: {ref} is a repo id, but the {name} reward loads no files from {key} "
                                  "with these options; give a local path")
            fetch = download_command(ref, names)
            try:
                folder = snapshot(ref, names, fetch=fetch)
            except HubUnavailable as exc:
                raise ConfigError(one_line(f"{field}: {exc}")) from None
            sources.append(Source(field, ref, folder, fetch))
    return sources


def model_source(config: SolRLConfig) -> Source | None:
    """model.path as a hub id: the pipeline's snapshot (only what the loader reads), or None for a folder."""
    ref = None if config.model.path == "embedded" else hub_ref(config.model.path)
    if ref is None:
        return None
    try:
        folder, fetch = pipeline_snapshot(ref)
    except (HubUnavailable, ValueError) as exc:
        raise ConfigError(one_line(f"model.path: {exc}")) from None
    return Source("model.path", ref, folder, fetch)


def with_sources(config: SolRLConfig, sources: list[Source]) -> SolRLConfig:
    """The config with each source's field set to its local folder (the config itself when there are none)."""
    if not sources:
        return config
    data = config.model_dump(mode="python")
    for source in sources:
        *parents, last = source.field.split(".")
        node = data
        for key in parents:
            node = node[key]
        node[last] = str(source.path)
    return SolRLConfig.model_validate(data)


def fetch_hint(sources: list[Source], field_prefix: str) -> str:
    """'; fetch with `…`' for the sources under `field_prefix` (a file found missing in their folder), or ''."""
    commands = [source.fetch for source in sources if source.field.startswith(field_prefix)]
    return f"; fetch {'them' if len(commands) > 1 else 'it'} with `{'` and `'.join(commands)}`" if commands else ""
