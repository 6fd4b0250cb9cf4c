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
        (['{"caption_id": "a cat"}'], r"line 1 has no prompt field: expected one of prompt, Prompt, Prompts, text, "
                                       r"caption, found caption_id"),
        (['{"prompt": 3}'], r"line 1 must be an object with a non-empty string 'prompt' field"),
        (['["a cat"]'], r"line 1 must be an object"),
        (['{"prompt": "a cat", "tag": "a"}', '{"prompt": "a cat", "tag": "b"}'],
         r"line 2 repeats the prompt 'a cat' with other metadata"),
        (["", "  "], r"holds no prompts"),
    ],
    ids=["bad-json", "no-prompt-field", "not-a-string", "not-an-object", "conflicting-duplicate", "empty"],
)
def test_bad_jsonl_is_refused_naming_the_line(tmp_path, lines, message):
    path = tmp_path / "set.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        load_prompt_set(str(path))


# ---- the formats users already have ------------------------------------------------------------------
def test_a_flow_grpo_dataset_folder_gives_its_train_split_and_its_test_split_held_out(tmp_path):
    ocr = tmp_path / "dataset" / "ocr"
    ocr.mkdir(parents=True)
    (ocr / "train.txt").write_text('A sign that says "open"\nA mug printed with "Sol"\n', encoding="utf-8")
    (ocr / "test.txt").write_text('A poster reading "RL"\n', encoding="utf-8")
    assert load_prompt_set(str(ocr)).texts == ['A sign that says "open"', 'A mug printed with "Sol"']
    assert load_prompt_set(str(ocr), heldout=True).texts == ['A poster reading "RL"']
    geneval = tmp_path / "dataset" / "geneval"
    geneval.mkdir()
    write_jsonl(geneval / "train_metadata.jsonl", GENEVAL_LINES[:1])
    write_jsonl(geneval / "test_metadata.jsonl", GENEVAL_LINES[1:])
    (geneval / "train.txt").write_text("the metadata file wins\n", encoding="utf-8")
    train, test = load_prompt_set(str(geneval)), load_prompt_set(str(geneval), heldout=True)
    assert train.texts == [GENEVAL_LINES[0]["prompt"]]
    assert train.metadata_of(train.texts) == [{k: v for k, v in GENEVAL_LINES[0].items() if k != "prompt"}]
    assert test.texts == [line["prompt"] for line in GENEVAL_LINES[1:]]
    with pytest.raises(FileNotFoundError, match=r"prompt folder \S+ has no test_metadata\.jsonl or test\.txt"):
        load_prompt_set(str(ocr.parent), heldout=True)


def test_a_drawbench_csv_gives_its_prompts_with_their_category_as_metadata(tmp_path):
    path = tmp_path / "drawbench.csv"
    path.write_text('Prompts,Category\n"A red colored car.",Colors\n"A black colored car, beside a tree.",Colors\n'
                    '\n"Hovering cow abducting aliens.",Conflicting\n', encoding="utf-8")
    prompts = load_prompt_set(str(path))
    assert prompts.texts == ["A red colored car.", "A black colored car, beside a tree.",
                             "Hovering cow abducting aliens."]
    assert prompts.metadata_of(prompts.texts) == [{"Category": "Colors"}, {"Category": "Colors"},
                                                  {"Category": "Conflicting"}]
    path.write_text("Category,Note\nColors,x\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"header has no prompt field: expected one of .*, found Category, Note"):
        load_prompt_set(str(path))


def test_a_parquet_file_is_named_with_what_to_do_instead(tmp_path):
    path = tmp_path / "train.parquet"
    path.write_bytes(b"PAR1")
    with pytest.raises(ValueError, match=r"is Parquet, which needs pyarrow .*convert it to \.jsonl or \.csv"):
        load_prompt_set(str(path))
