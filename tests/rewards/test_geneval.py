"""The geneval rules on hand-made detections (exact values from the official rules), and the reward's plumbing."""

from __future__ import annotations

import pytest
import torch

from rewards.base import build_reward, known_rewards
from rewards.geneval import (
    TAGS,
    Detection,
    GenEval,
    box_iou,
    build_detector,
    judge,
    known_detectors,
    register_detector,
    relative_position,
    select_objects,
)


def det(label: str, score: float, box=(0, 0, 10, 10), color: str | None = None) -> Detection:
    return Detection(label, score, tuple(float(v) for v in box), color)


def verdict(detections, metadata, **options):
    v = judge(detections, metadata, **options)
    return v.correct, v.strict_correct, v.score, v.clause_accuracy


SINGLE = {"tag": "single_object", "include": [{"class": "dog", "count": 1}]}
TWO = {"tag": "two_object", "include": [{"class": "cat", "count": 1}, {"class": "dog", "count": 1}]}
COUNTING = {"tag": "counting", "include": [{"class": "apple", "count": 3}], "exclude": [{"class": "apple", "count": 4}]}
COLORS_ = {"tag": "colors", "include": [{"class": "car", "count": 1, "color": "red"}]}
# "a photo of a dog left of a bench" (create_prompts.py: the referred object comes first; JSON gives a list)
POSITION = {"tag": "position",
            "include": [{"class": "bench", "count": 1}, {"class": "dog", "count": 1, "position": ["left of", 0]}]}
COLOR_ATTR = {"tag": "color_attr", "include": [{"class": "bus", "count": 1, "color": "red"},
                                               {"class": "bicycle", "count": 1, "color": "blue"}]}


# --- selection ---------------------------------------------------------------------------------

def test_iou_counts_end_pixels_as_the_official_compute_iou():
    assert box_iou((0, 0, 9, 9), (0, 0, 9, 9)) == 1.0
    assert box_iou((0, 0, 9, 9), (5, 0, 14, 9)) == pytest.approx(50 / 150)  # 5×10 of 10×10 + 10×10
    assert box_iou((0, 0, 9, 9), (20, 20, 29, 29)) == 0.0


def test_selection_thresholds_are_strict_and_depend_on_the_tag():
    found = [det("dog", 0.3), det("dog", 0.31), det("dog", 0.9), det("dog", 0.95), det("cat", 0.2)]
    kept = select_objects(found, "single_object")
    assert [d.score for d in kept["dog"]] == [0.95, 0.9, 0.31]  # most confident first; 0.3 is not > 0.3
    assert "cat" not in kept
    assert [d.score for d in select_objects(found, "counting")["dog"]] == [0.95]  # 0.9 is not > 0.9


def test_selection_caps_the_count_and_suppresses_overlaps_only_when_asked():
    many = [det("cup", 0.5 + i / 100, (i, 0, i + 10, 10)) for i in range(20)]
    assert len(select_objects(many, "two_object")["cup"]) == 16
    assert len(select_objects(many, "two_object", max_objects=3)["cup"]) == 3
    twins = [det("dog", 0.9, (0, 0, 9, 9)), det("dog", 0.8, (1, 0, 10, 9)), det("dog", 0.7, (50, 50, 59, 59))]
    assert len(select_objects(twins, "single_object")["dog"]) == 3  # max_overlap 1.0: no suppression
    kept = select_objects(twins, "single_object", max_overlap=0.5)["dog"]
    assert [d.score for d in kept] == [0.9, 0.7]  # IoU 90/110 ≥ 0.5 with the 0.9 box


# --- relative position ----------------------------------------------------------------------------

def test_relative_position_rule_with_its_margin():
    bench = (300, 0, 400, 100)
    assert relative_position((0, 0, 100, 100), bench) == {"left of"}  # dx = −280/300
    assert relative_position(bench, (0, 0, 100, 100)) == {"right of"}
    # Centres 15 px apart, margin 0.1 × (100 + 100) = 20 px: no relation at all.
    assert relative_position((0, 0, 100, 100), (15, 0, 115, 100)) == set()
    # 30 px apart: shrunk to 10 px, but divided by the unshrunk 30 → 1/3 ≤ 0.5: still none.
    assert relative_position((0, 0, 100, 100), (30, 0, 130, 100)) == set()
    # 50 px apart: (50 − 20) / 50 = 0.6 > 0.5 → left of.
    assert relative_position((0, 0, 100, 100), (50, 0, 150, 100)) == {"left of"}
    # Diagonal, small boxes: (−98, −98) / 141.4 → both left of and above (y grows downward).
    assert relative_position((0, 0, 10, 10), (100, 100, 110, 110)) == {"left of", "above"}
    assert relative_position((100, 100, 110, 110), (0, 0, 10, 10)) == {"right of", "below"}
    # Mostly vertical: dx = −48 / 206.2 → only above.
    assert relative_position((0, 0, 10, 10), (50, 200, 60, 210)) == {"above"}


# --- one test per official tag: (correct, strict_correct, score, clause_accuracy) -------------------------

def test_single_object():
    assert verdict([det("dog", 0.95)], SINGLE) == (True, True, 1.0, 1.0)
    assert verdict([det("dog", 0.3)], SINGLE) == (False, False, 0.0, 0.0)  # not above the threshold
    assert verdict([det("cat", 0.99)], SINGLE) == (False, False, 0.0, 0.0)
    # Two dogs: GenEval asks for at least one; Flow-GRPO for exactly one, crediting 1 − |1 − 2| / 1 = 0.
    assert verdict([det("dog", 0.9), det("dog", 0.8)], SINGLE) == (True, False, 0.0, 1.0)
    # Three: 1 − |1 − 3| / 1 = −1 (Flow-GRPO's partial credit can go negative).
    assert verdict([det("dog", 0.9)] * 3, SINGLE) == (True, False, -1.0, 1.0)


def test_two_object():
    assert verdict([det("cat", 0.5), det("dog", 0.6)], TWO) == (True, True, 1.0, 1.0)
    assert verdict([det("cat", 0.5)], TWO) == (False, False, 0.5, 0.5)  # credits [1, 0]
    assert verdict([det("cat", 0.5), det("dog", 0.6), det("dog", 0.7)], TWO) == (True, False, 0.5, 1.0)


def test_counting_uses_the_high_threshold_and_the_exclude_entry():
    three = [det("apple", 0.95, (i * 20, 0, i * 20 + 10, 10)) for i in range(3)]
    assert verdict([*three, det("apple", 0.85)], COUNTING) == (True, True, 1.0, 1.0)  # 0.85 is not > 0.9
    four = [*three, det("apple", 0.91)]
    assert verdict(four, COUNTING) == (False, False, pytest.approx(2 / 3), 0.5)  # exclude: 4 ≥ 4
    assert verdict(three[:2], COUNTING) == (False, False, pytest.approx(2 / 3), 0.5)  # include fails, exclude holds
    assert verdict([], COUNTING) == (False, False, 0.0, 0.5)


def test_colors():
    assert verdict([det("car", 0.8, color="red")], COLORS_) == (True, True, 1.0, 1.0)
    assert verdict([det("car", 0.8, color="blue")], COLORS_) == (False, False, 0.5, 0.0)  # credits [1, 0]
    # GenEval checks only the most confident car (blue); Flow-GRPO sees two cars: credits [0, 0].
    two = [det("car", 0.9, color="blue"), det("car", 0.8, color="red")]
    assert verdict(two, COLORS_) == (False, False, 0.0, 0.0)
    two = [det("car", 0.9, color="red"), det("car", 0.8, color="blue")]
    assert verdict(two, COLORS_) == (True, False, 0.0, 1.0)
    assert verdict([det("car", 0.2, color="red")], COLORS_) == (False, False, 0.0, 0.0)  # credits [0, 0]
    with pytest.raises(ValueError, match="no colour"):
        judge([det("car", 0.8)], COLORS_)


def test_position():
    bench = det("bench", 0.9, (300, 0, 400, 100))
    assert verdict([bench, det("dog", 0.9, (0, 0, 100, 100))], POSITION) == (True, True, 1.0, 1.0)
    # Within the margin: no relation → fails; Flow-GRPO credits [1, 1, 0, 1] (its trailing 1 is appended anyway).
    close = [det("bench", 0.9, (15, 0, 115, 100)), det("dog", 0.9, (0, 0, 100, 100))]
    assert verdict(close, POSITION) == (False, False, 0.75, 0.5)
    # The dog is above, not left of, the bench.
    above = [det("bench", 0.9, (50, 200, 60, 210)), det("dog", 0.9, (0, 0, 10, 10))]
    assert verdict(above, POSITION) == (False, False, 0.75, 0.5)
    # No bench: the dog has no target; credits [0, 1, 0].
    assert verdict([det("dog", 0.9)], POSITION) == (False, False, pytest.approx(1 / 3), 0.0)
    # Two dogs: GenEval checks the most confident one only; Flow-GRPO fails the count, credits [1, 0, 0].
    dogs = [bench, det("dog", 0.9, (0, 0, 100, 100)), det("dog", 0.8, (500, 0, 600, 100))]
    assert verdict(dogs, POSITION) == (True, False, pytest.approx(1 / 3), 1.0)
    dogs = [bench, det("dog", 0.8, (0, 0, 100, 100)), det("dog", 0.9, (500, 0, 600, 100))]
    assert verdict(dogs, POSITION) == (False, False, pytest.approx(1 / 3), 0.5)


def test_position_checks_every_pair_when_counts_exceed_one():
    meta = {"tag": "position", "include": [{"class": "bench", "count": 2},
                                           {"class": "dog", "count": 1, "position": ["below", 0]}]}
    benches = [det("bench", 0.9, (0, 0, 10, 10)), det("bench", 0.8, (200, 0, 210, 10))]
    dog_under_first = det("dog", 0.9, (0, 300, 10, 310))  # below both: dy = 298/300 and 298/360.6
    assert verdict([*benches, dog_under_first], meta) == (True, True, 1.0, 1.0)
    dog_beside = det("dog", 0.9, (0, 100, 10, 110))  # below the first; for the second dy = 98/223.6 < 0.5
    assert relative_position(dog_beside.box, benches[1].box) == {"left of"}
    assert verdict([*benches, dog_beside], meta) == (False, False, 0.75, 0.5)


def test_color_attr():
    right = [det("bus", 0.9, color="red"), det("bicycle", 0.9, color="blue")]
    assert verdict(right, COLOR_ATTR) == (True, True, 1.0, 1.0)
    wrong = [det("bus", 0.9, color="red"), det("bicycle", 0.9, color="green")]
    assert verdict(wrong, COLOR_ATTR) == (False, False, 0.75, 0.5)  # credits [1, 1, 1, 0]
    swapped = [det("bus", 0.9, color="blue"), det("bicycle", 0.9, color="red")]
    assert verdict(swapped, COLOR_ATTR) == (False, False, 0.5, 0.0)


def test_metadata_errors_are_named():
    with pytest.raises(ValueError, match="needs a 'tag'"):
        judge([], {})
    with pytest.raises(ValueError, match="'class' and 'count'"):
        judge([], {"tag": "single_object", "include": [{"class": "dog"}]})
    with pytest.raises(ValueError, match="must come before it"):
        judge([det("dog", 0.9)], {"tag": "position", "include": [{"class": "dog", "count": 1,
                                                                  "position": ["above", 0]}]})
    with pytest.raises(ValueError, match="not one of GenEval's colours"):
        det("dog", 0.9, color="teal")


# --- the reward ------------------------------------------------------------------------------------

class CannedDetector:
    """Returns fixed detections, one list per image."""

    def __init__(self, detections):
        self.detections = detections
        self.calls = 0

    def __call__(self, images, metadata):
        self.calls += 1
        assert images.shape[0] == len(metadata)
        return self.detections[: images.shape[0]]


def test_reward_reports_every_verdict_and_the_chosen_objective():
    detections = [[det("dog", 0.95)], [det("cat", 0.5)], [det("car", 0.8, color="blue")]]
    metadata = [SINGLE, TWO, COLORS_]
    images = torch.rand(3, 3, 16, 16)
    prompts = ["a photo of a dog", "a photo of a cat and a dog", "a photo of a red car"]
    reward = GenEval(detector=CannedDetector(detections))
    scores, details = reward.score_and_details(images, prompts, metadata)
    torch.testing.assert_close(scores, torch.tensor([1.0, 0.5, 0.5]))
    torch.testing.assert_close(details["correct"], torch.tensor([1.0, 0.0, 0.0]))
    torch.testing.assert_close(details["strict_correct"], torch.tensor([1.0, 0.0, 0.0]))
    torch.testing.assert_close(details["clause_accuracy"], torch.tensor([1.0, 0.5, 0.0]))
    torch.testing.assert_close(details["tag"], torch.tensor([float(TAGS.index(m["tag"])) for m in metadata]))
    strict = GenEval(detector=CannedDetector(detections), objective="correct")
    torch.testing.assert_close(strict(images, prompts, metadata), torch.tensor([1.0, 0.0, 0.0]))
    with pytest.raises(ValueError, match="prompt 1: GenEval metadata needs a 'tag'"):
        reward(images, prompts, [SINGLE, {}, COLORS_])


def test_detectors_are_registered_by_name():
    @register_detector("canned_for_test")
    class Named(CannedDetector):
        required_files = classmethod(lambda cls, **options: [])

    assert "canned_for_test" in known_detectors()
    reward = build_reward("geneval", detector="canned_for_test", detector_options={"detections": [[det("dog", 1.0)]]})
    assert reward(torch.rand(1, 3, 8, 8), ["a photo of a dog"], [SINGLE]).tolist() == [1.0]
    assert GenEval.required_files(detector="canned_for_test") == []
    with pytest.raises(ValueError, match="already registered"):
        register_detector("canned_for_test")(CannedDetector)


def test_without_a_detector_the_error_says_what_to_install_and_where():
    assert "geneval" in known_rewards()
    with pytest.raises(RuntimeError, match="needs an object detector") as error:
        build_reward("geneval")
    for words in ("Mask2Former", "mmcv", "CUDA", "register_detector"):
        assert words in str(error.value)
    with pytest.raises(ValueError, match="no detector 'mask2former' is registered"):
        build_detector("mask2former")
