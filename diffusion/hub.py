"""Hugging Face repo ids where a folder is accepted: `org/name` or `org/name@revision` → a local snapshot.

A value names the hub only when it is no path on this machine and reads as a repo id; anything else stays a
local path (and fails as one). `snapshot` goes through `huggingface_hub.snapshot_download` with the patterns
of what the caller will load (a pipeline's components, a reward's files), so a hub repo's single-file
checkpoints and other formats are never fetched. With `HF_HUB_OFFLINE=1` it reads the local cache only
(`models--org--name/snapshots/<commit>/`, `refs/<revision>`), and a repo that is not there is one line naming
it and the `hf download` command that fetches exactly those files. Gated repos (SD3.5, FLUX.1-dev) need their
licence accepted at the repo's page and a token (`hf auth login`, or `HF_TOKEN`).

Called once per launch, before Ray starts (`cluster.config.hub_sources`); actors only ever see local paths.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# huggingface_hub's own rule for repo ids (`validate_repo_id`): one slash, these characters.
_REPO_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w./-]+))?$")
_TRUE = {"1", "on", "yes", "true"}
MODEL_CARD = "README.md"


@dataclass(frozen=True)
class HubRef:
    """A repo on the hub (a model's, or a dataset's), at a revision (None: the default branch)."""

    repo: str
    revision: str | None = None
    kind: str = "model"  # huggingface_hub's repo_type: "model" or "dataset"

    def __str__(self) -> str:
        name = self.repo if self.revision is None else f"{self.repo}@{self.revision}"
        return name if self.kind == "model" else f"hf://datasets/{name}"

    @property
    def url(self) -> str:
        return f"https://huggingface.co/{'' if self.kind == 'model' else 'datasets/'}{self.repo}"


def hub_ref(value: str) -> HubRef | None:
    """The repo `value` names, or None when it is a local path: an existing path always is, and so is anything
    starting with `/`, `.` or `~`, or not shaped as `org/name[@revision]`."""
    if not value or value.startswith(("/", ".", "~")) or Path(value).exists():
        return None
    match = _REPO_ID.match(value)
    if match is None or ".." in match["repo"]:
        return None
    return HubRef(match["repo"], match["revision"])


_DATASET_FILE = re.compile(r"^hf://datasets/(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w.-]+))?/"
                           r"(?P<path>[^@]+)$")


def dataset_file(value: str) -> tuple[HubRef, str] | None:
    """(the dataset repo, the file's path in it) of `hf://datasets/org/name[@revision]/path/to/file`, the hf
    CLI's own address form; None for anything else."""
    match = _DATASET_FILE.match(value)
    if match is None or ".." in value:
        return None
    return HubRef(match["repo"], match["revision"], kind="dataset"), match["path"]


def offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it, at call time (the library reads it once, at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def download_command(ref: HubRef, include: Sequence[str], exclude: Sequence[str] = ()) -> str:
    """The `hf download` command that fetches these patterns of `ref` into the cache."""
    words = ["hf", "download", ref.repo]
    if ref.kind != "model":
        words += ["--repo-type", ref.kind]
    if ref.revision is not None:
        words += ["--revision", ref.revision]
    for flag, patterns in (("--include", include), ("--exclude", exclude)):
        for pattern in patterns:
            words += [flag, pattern]
    return shlex.join(words)


class HubUnavailable(FileNotFoundError):
    """A repo that cannot be had here: not in the cache while offline, gated, missing, or the hub unreachable.
    The message is one line naming the repo, why, and the command that fixes it."""


def _cache_note(cache_dir: str | os.PathLike | None) -> str:
    from huggingface_hub import constants

    return str(cache_dir if cache_dir is not None else constants.HF_HUB_CACHE)


def snapshot(ref: HubRef, include: Sequence[str], exclude: Sequence[str] = (), *,
             cache_dir: str | os.PathLike | None = None, fetch: str | None = None) -> Path:
    """The snapshot folder of `ref` holding the files matching `include` minus `exclude` (fnmatch patterns, as
    huggingface_hub matches them), downloaded when online; from the cache only when offline. Offline, the folder
    is returned if the revision is cached at all: what it holds is checked by the caller, who knows the files.
    `fetch`: the download command the errors name (default: the one for these patterns)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    fetch = fetch or download_command(ref, include, exclude)
    try:
        return Path(snapshot_download(ref.repo, repo_type=ref.kind, revision=ref.revision, allow_patterns=list(include),
                                      ignore_patterns=list(exclude) or None, cache_dir=cache_dir,
                                      local_files_only=offline()))
    except GatedRepoError:
        raise HubUnavailable(f"{ref} is gated: accept its licence at {ref.url}, log in (`hf auth login`, or set "
                             f"HF_TOKEN), then run this again or `{fetch}`") from None
    except RevisionNotFoundError:
        raise HubUnavailable(f"{ref}: the hub has no revision {ref.revision!r} of {ref.repo}; name a branch, tag or "
                             f"commit of {ref.url}") from None
    except RepositoryNotFoundError:
        raise HubUnavailable(f"{ref} is not a repo on the hub (or a private one: log in with `hf auth login`); "
                             f"check the id at {ref.url}") from None
    except LocalEntryNotFoundError:
        why = ("HF_HUB_OFFLINE=1 forbids downloading" if offline()
               else "the hub could not be reached")
        raise HubUnavailable(f"{ref} is not in the Hugging Face cache ({_cache_note(cache_dir)}) and {why}; fetch "
                             f"it where the hub is reachable with `{fetch}` (if the repo is gated, accept its "
                             f"licence at {ref.url} first)") from None
    except HfHubHTTPError as exc:
        raise HubUnavailable(f"{ref}: the hub answered {' '.join(str(exc).split())[:200]}; fetch it with "
                             f"`{fetch}`, or set HF_HUB_OFFLINE=1 to use the cache") from None


def pipeline_snapshot(ref: HubRef, *, cache_dir: str | os.PathLike | None = None) -> tuple[Path, str]:
    """(snapshot folder, its download command) of a diffusers pipeline repo, with only what `load_policy`
    reads (`diffusion.loading.pipeline_patterns`) and the repo's model card: model_index.json first, which names
    the components, then those components' files at the same commit. What the folder holds is for
    `check_model_folder` to judge."""
    from diffusion.loading import COMMON_COMPONENTS, listed_components, pipeline_patterns

    folder = snapshot(ref, ["model_index.json"], cache_dir=cache_dir,
                      fetch=download_command(ref, *pipeline_patterns(COMMON_COMPONENTS)))
    index_file = folder / "model_index.json"
    if not index_file.is_file():  # offline, and the cached revision lacks it
        raise HubUnavailable(f"{ref} is in the Hugging Face cache ({folder}) without its model_index.json; fetch "
                             f"the pipeline with `{download_command(ref, *pipeline_patterns(COMMON_COMPONENTS))}`")
    try:
        index = json.loads(index_file.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"{index_file} is not JSON ({exc}); download it again") from None
    include, exclude = pipeline_patterns(listed_components(index) if isinstance(index, dict) else [])
    include.append(MODEL_CARD)  # not loaded, but an export's model card inherits the base's licence from it
    fetch = download_command(ref, include, exclude)
    return snapshot(HubRef(ref.repo, folder.name), include, exclude, cache_dir=cache_dir, fetch=fetch), fetch
