"""Prompt sets: the embedded digit prompts, a text file (one prompt a line), or JSONL with metadata.

The formats of the official prompt sets:
- text, one prompt a line: the PickScore / HPS / DrawBench lists and the OCR set, whose target text
  is quoted inside the prompt (`a sign that says "open"`), so it needs no metadata;
- JSONL (`.jsonl`), one object a line with a `prompt` field; every other field is that prompt's
  metadata, handed to the reward beside the prompt — GenEval's `evaluation_metadata.jsonl`
  (`{"tag": "counting", "include": [{"class": "cat", "count": 2}], "prompt": "a photo of two cats"}`).

Only prompt texts (and seeds) cross actors: every actor loads the same set and looks a prompt's
metadata up by its text (`PromptSet.metadata_of`), so a set must not give one text two metadata.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diffusion.embedded.data import heldout_prompts, train_prompts


@dataclass(frozen=True)
class PromptSet:
    texts: list[str]
    metadata: dict[str, dict[str, Any]] = field(default_factory=dict)  # text → its metadata ({} when none)

    def metadata_of(self, prompts: str | Sequence[str]) -> list[dict[str, Any]]:
        """One metadata dict per prompt (a copy; {} for prompts without any)."""
        prompts = [prompts] if isinstance(prompts, str) else prompts
        return [dict(self.metadata.get(text, {})) for text in prompts]


def _read_text(path: Path) -> str:
    if path.is_dir():
        raise IsADirectoryError(f"prompt file {path} is a directory; name a text file (one prompt a line) or JSONL")
    if not path.is_file():
        raise FileNotFoundError(f"prompt file {path} does not exist (use 'embedded', a text file or a .jsonl file)")
    data = path.read_bytes()
    try:
        return data.decode("utf-8").removeprefix("\ufeff")  # a byte-order mark some editors write is no prompt
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ValueError(
            f"prompt file {path} is not UTF-8 text (byte 0x{data[exc.start]:02x} at line {line}); save it as UTF-8"
        ) from None


def _parse_jsonl(path: Path, text: str) -> PromptSet:
    texts: list[str] = []
    metadata: dict[str, dict[str, Any]] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"prompt file {path} line {number} is not JSON ({error.msg}); "
                             f"a .jsonl prompt set holds one object a line") from None
        if not isinstance(record, dict) or not isinstance(record.get("prompt"), str) or not record["prompt"].strip():
            raise ValueError(f"prompt file {path} line {number} must be an object with a non-empty string "
                             f"'prompt' field, got {line.strip()[:80]!r}")
        prompt = record.pop("prompt").strip()
        if prompt in metadata and metadata[prompt] != record:
            raise ValueError(f"prompt file {path} line {number} repeats the prompt {prompt!r} with other metadata; "
                             f"rewards look metadata up by prompt text, so each text needs one")
        metadata[prompt] = record
        texts.append(prompt)
    return PromptSet(texts, metadata)


def load_prompt_set(source: str, *, heldout: bool = False) -> PromptSet:
    """The prompts of a source, with their metadata: 'embedded' (training or held-out digit prompts),
    a UTF-8 text file (one prompt a line) or a `.jsonl` file (objects with a `prompt` field)."""
    if source == "embedded":
        return PromptSet(heldout_prompts() if heldout else train_prompts())
    path = Path(source)
    text = _read_text(path)
    if path.suffix == ".jsonl":
        prompts = _parse_jsonl(path, text)
    else:
        prompts = PromptSet([line.strip() for line in text.splitlines() if line.strip()])
    if not prompts.texts:
        raise ValueError(f"prompt file {path} holds no prompts (it is empty or only whitespace); write one per line")
    return prompts


def load_prompts(source: str, *, heldout: bool = False) -> list[str]:
    """The prompt texts of a source (see `load_prompt_set`)."""
    return load_prompt_set(source, heldout=heldout).texts
