"""Prompt sets: plain text and JSONL with per-prompt metadata, and their errors."""

from __future__ import annotations

import json

import pytest

from diffusion.prompts import load_prompt_set, load_prompts

GENEVAL_LINES = [
    {"tag": "single_object", "include": [{"class": "bench", "count": 1}], "prompt": "a photo of a bench"},
    {"tag": "counting", "include": [{"class": "cat", "count": 2}], "exclude": [{"class": "cat", "count": 3}],
     "prompt": "a photo of two cats"},
]


def write_jsonl(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def test_jsonl_keeps_every_field_but_the_prompt_as_that_prompts_metadata(tmp_path):
    path = tmp_path / "evaluation_metadata.jsonl"
    write_jsonl(path, GENEVAL_LINES)
    prompts = load_prompt_set(str(path))
    assert prompts.texts == ["a photo of a bench", "a photo of two cats"]
    cats = prompts.metadata_of("a photo of two cats")[0]
    assert cats == {"tag": "counting", "include": [{"class": "cat", "count": 2}],
                    "exclude": [{"class": "cat", "count": 3}]}
    # one dict per prompt, {} for unknown texts, and copies: a reward may not alter the set
    both = prompts.metadata_of(["a photo of a bench", "an unknown prompt"])
    assert both == [{"tag": "single_object", "include": [{"class": "bench", "count": 1}]}, {}]
    both[0]["tag"] = "changed"
    assert prompts.metadata_of("a photo of a bench")[0]["tag"] == "single_object"
    assert load_prompts(str(path)) == prompts.texts


def test_text_files_have_no_metadata_and_a_repeated_identical_jsonl_line_is_kept(tmp_path):
    text = tmp_path / "ocr.txt"
    text.write_text('a sign that says "open"\n\nA poster reading "Sol RL"\n', encoding="utf-8")
    prompts = load_prompt_set(str(text))
    assert prompts.texts == ['a sign that says "open"', 'A poster reading "Sol RL"']
    assert prompts.metadata_of(prompts.texts) == [{}, {}]
    path = tmp_path / "twice.jsonl"
    write_jsonl(path, [GENEVAL_LINES[0], GENEVAL_LINES[0]])
    assert load_prompt_set(str(path)).texts == ["a photo of a bench"] * 2


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"prompt": "a cat"}', "{not json"], r"line 2 is not JSON .*one object a line"),
        (['{"text": "a cat"}'], r"line 1 must be an object with a non-empty string 'prompt' field"),
        (['["a cat"]'], r"line 1 must be an object"),
        (['{"prompt": "a cat", "tag": "a"}', '{"prompt": "a cat", "tag": "b"}'],
         r"line 2 repeats the prompt 'a cat' with other metadata"),
        (["", "  "], r"holds no prompts"),
    ],
    ids=["bad-json", "no-prompt-field", "not-an-object", "conflicting-duplicate", "empty"],
)
def test_bad_jsonl_is_refused_naming_the_line(tmp_path, lines, message):
    path = tmp_path / "set.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        load_prompt_set(str(path))
