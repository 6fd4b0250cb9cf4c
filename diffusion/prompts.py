"""Prompt sets: the embedded digit prompts, or the files of the official prompt sets, by format.

- text, one prompt a line: the PickScore / HPS lists and the OCR set, whose target text is quoted inside the
  prompt (`a sign that says "open"`), so it needs no metadata;
- JSONL (`.jsonl`), one object a line with a prompt field; every other field is that prompt's metadata, handed
  to the reward beside the prompt — GenEval's `evaluation_metadata.jsonl` and flow_grpo's
  `dataset/geneval/{train,test}_metadata.jsonl`
  (`{"tag": "counting", "include": [{"class": "cat", "count": 2}], "prompt": "a photo of two cats"}`);
- CSV (`.csv`) with a header: DrawBench's sheet (`Prompts`, `Category`); every other column is metadata;
- a folder in flow_grpo's layout (`dataset/ocr/`, `dataset/pickscore/`, `dataset/geneval/`): the training set
  reads `train_metadata.jsonl` or `train.txt` in it (flow_grpo's `GenevalPromptDataset` / `TextPromptDataset`),
  the held-out set `test_metadata.jsonl` or `test.txt`.

The prompt field (JSONL) or column (CSV) is the first of `PROMPT_FIELDS` the records have. A file on the hub,
`hf://datasets/org/name[@revision]/path`, is fetched into the local cache before Ray starts
(`cluster.config.hub_sources`); this module only ever reads local files.

Only prompt texts (and seeds) cross actors: every actor loads the same set and looks a prompt's
metadata up by its text (`PromptSet.metadata_of`), so a set must not give one text two metadata.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Sequence
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
    if not path.is_file():
        raise FileNotFoundError(f"prompt file {path} does not exist (use 'embedded', a text, .jsonl or .csv file, a "
                                "flow_grpo-layout folder, or hf://datasets/org/name/file)")
    data = path.read_bytes()
    try:
        return data.decode("utf-8").removeprefix("\ufeff")  # a byte-order mark some editors write is no prompt
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ValueError(
            f"prompt file {path} is not UTF-8 text (byte 0x{data[exc.start]:02x} at line {line}); save it as UTF-8"
        ) from None


PROMPT_FIELDS = ("prompt", "Prompt", "Prompts", "text", "caption")
# flow_grpo's file names in a prompt-set folder, by split: metadata first (its GenEval sets have both kinds)
SPLIT_FILES = {False: ("train_metadata.jsonl", "train.txt"), True: ("test_metadata.jsonl", "test.txt")}


def _prompt_field(path: Path, where: str, names: Iterable[str]) -> str:
    for name in PROMPT_FIELDS:
        if name in names:
            return name
    raise ValueError(f"prompt file {path} {where} has no prompt field: expected one of {', '.join(PROMPT_FIELDS)}, "
                     f"found {', '.join(map(str, names)) or 'none'}")


def _collect(path: Path, records: Iterable[tuple[int, str, dict[str, Any]]]) -> PromptSet:
    """(line, prompt, metadata) records → a PromptSet; one text may not carry two metadata."""
    texts: list[str] = []
    metadata: dict[str, dict[str, Any]] = {}
    for number, prompt, record in records:
        prompt = prompt.strip()
        if not prompt:
            raise ValueError(f"prompt file {path} line {number} has an empty prompt")
        if prompt in metadata and metadata[prompt] != record:
            raise ValueError(f"prompt file {path} line {number} repeats the prompt {prompt!r} with other metadata; "
                             f"rewards look metadata up by prompt text, so each text needs one")
        metadata[prompt] = record
        texts.append(prompt)
    return PromptSet(texts, metadata)


def _parse_jsonl(path: Path, text: str) -> PromptSet:
    def records():
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"prompt file {path} line {number} is not JSON ({error.msg}); "
                                 f"a .jsonl prompt set holds one object a line") from None
            if not isinstance(record, dict):
                raise ValueError(f"prompt file {path} line {number} must be an object with a prompt field, got "
                                 f"{line.strip()[:80]!r}")
            name = _prompt_field(path, f"line {number}", record)
            if not isinstance(record[name], str) or not record[name].strip():
                raise ValueError(f"prompt file {path} line {number} must be an object with a non-empty string "
                                 f"{name!r} field, got {line.strip()[:80]!r}")
            prompt = record.pop(name)
            yield number, prompt, record

    return _collect(path, records())


def _parse_csv(path: Path, text: str) -> PromptSet:
    reader = csv.DictReader(io.StringIO(text))
    name = _prompt_field(path, "header", reader.fieldnames or [])

    def records():
        for row in reader:
            prompt = row.pop(name) or ""
            if not prompt.strip() and not any(row.values()):
                continue  # a blank line
            yield reader.line_num, prompt, {key: value for key, value in row.items() if key and value}

    return _collect(path, records())


def _split_file(folder: Path, heldout: bool) -> Path:
    """The file of a flow_grpo-layout folder that holds this split."""
    for name in SPLIT_FILES[heldout]:
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"prompt folder {folder} has no {' or '.join(SPLIT_FILES[heldout])} (flow_grpo's layout: "
                            f"the {'held-out' if heldout else 'training'} split); name a file instead")


def load_prompt_set(source: str, *, heldout: bool = False) -> PromptSet:
    """The prompts of a source, with their metadata: 'embedded' (training or held-out digit prompts), a UTF-8 text
    file (one prompt a line), a `.jsonl` or `.csv` file, or a flow_grpo-layout folder (its `heldout` split)."""
    if source == "embedded":
        return PromptSet(heldout_prompts() if heldout else train_prompts())
    path = Path(source)
    if path.is_dir():
        path = _split_file(path, heldout)
    text = _read_text(path)
    if path.suffix == ".jsonl":
        prompts = _parse_jsonl(path, text)
    elif path.suffix == ".csv":
        prompts = _parse_csv(path, text)
    elif path.suffix == ".parquet":
        raise ValueError(f"prompt file {path} is Parquet, which needs pyarrow (not installed here); convert it to "
                         ".jsonl or .csv, or choose the repo's text, JSONL or CSV file")
    else:
        prompts = PromptSet([line.strip() for line in text.splitlines() if line.strip()])
    if not prompts.texts:
        raise ValueError(f"prompt file {path} holds no prompts (it is empty or only whitespace); write one per line")
    return prompts


def load_prompts(source: str, *, heldout: bool = False) -> list[str]:
    """The prompt texts of a source (see `load_prompt_set`)."""
    return load_prompt_set(source, heldout=heldout).texts
