"""`Reward.check_prompts`: what each reward needs of a whole prompt set, decided before any reward is built
(no weights loaded), with the same rule the reward applies when it scores."""

from __future__ import annotations

import pytest

from diffusion.embedded.data import heldout_prompts, train_prompts
from rewards.base import known_rewards, reward_class

DIGIT_WORDS = "zero, one, two, three, four, five, six, seven, eight, nine"
GENEVAL = {"tag": "counting", "include": [{"class": "cat", "count": 2}], "exclude": [{"class": "cat", "count": 3}]}


def check(name: str, prompts: list[str], metadata: list[dict] | None = None) -> None:
    reward_class(name).check_prompts(prompts, metadata if metadata is not None else [{} for _ in prompts])


@pytest.mark.parametrize("name", ["digit_alignment", "digit_margin"])
def test_digit_rewards_need_one_digit_named_in_each_prompt(name):
    check(name, train_prompts() + heldout_prompts())
    with pytest.raises(ValueError) as info:
        check(name, ["a handwritten digit seven", "a red fox sitting in fresh snow"])
    assert str(info.value) == (f"prompt 1: prompt 'a red fox sitting in fresh snow' must name exactly one digit in "
                               f"words ({DIGIT_WORDS}); found none (the embedded prompt sets, 'embedded', name one "
                               f"each)")
    with pytest.raises(ValueError, match=r"^prompt 0: .* found \['one', 'two'\]"):
        check(name, ["one or two"])


def test_ocr_needs_a_quoted_text_in_each_prompt():
    check("ocr", ['a sign that says "Open Now"', 'a neon "bar" sign'])
    with pytest.raises(ValueError) as info:
        check("ocr", ['a sign that says "Open"', "a quiet street at night"])
    assert str(info.value) == ("prompt 1: the ocr reward needs the target text in double quotes in the prompt, "
                               "got 'a quiet street at night'")
    with pytest.raises(ValueError) as info:
        check("ocr", ['a sign that says "  "'])
    assert str(info.value) == ("prompt 0: the quoted text '  ' is empty once spaces are removed: nothing to read "
                               "in 'a sign that says \"  \"'")


def test_geneval_needs_each_prompts_metadata():
    check("geneval", ["a photo of two cats"], [GENEVAL])
    with pytest.raises(ValueError) as info:
        check("geneval", ["a photo of two cats", "a photo of a dog"], [GENEVAL, {}])
    assert str(info.value).startswith("prompt 1: GenEval metadata needs a 'tag' (one of ('single_object', ")
    assert str(info.value).endswith("got {}; use a GenEval .jsonl prompt set (evaluation_metadata.jsonl's format)")
    with pytest.raises(ValueError, match=r"^prompt 0: GenEval include entry 0 needs 'class' and 'count'"):
        check("geneval", ["x"], [{"tag": "counting", "include": [{"class": "cat"}]}])
    with pytest.raises(ValueError, match=r"^prompt 0: "):  # a count of the wrong type: not a TypeError
        check("geneval", ["x"], [{"tag": "counting", "include": [{"class": "cat", "count": [2]}]}])


def test_the_other_rewards_read_any_prompt():
    needy = {"digit_alignment", "digit_margin", "ocr", "geneval"}
    for name in sorted(set(known_rewards()) - needy):
        check(name, ["a red fox sitting in fresh snow", "", "☃"])
