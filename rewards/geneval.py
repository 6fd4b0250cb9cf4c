"""geneval: GenEval's object-level checks of an image against its prompt's metadata, over a pluggable detector.

GenEval (djghosh13/geneval) detects objects with Mask2Former and classifies the colour of each
detected object with CLIP, then checks the prompt's metadata (`prompts/evaluation_metadata.jsonl`,
written by `prompts/create_prompts.py`; `prompt` is handed to the reward separately):

    {"tag": "position",
     "include": [{"class": "bench", "count": 1}, {"class": "dog", "count": 1, "position": ["left of", 0]}],
     "exclude": [...]}                     # only the counting prompts have one: {"class", "count": N + 1}

tags: single_object, two_object, counting, colors, position, color_attr; an include entry may
carry `color` (one of COLORS) and `position` ([relation, index of an earlier include entry]). A
prompt set without this metadata (a text file) is refused before a job starts (`check_prompts`).

This module implements the rules as pure functions over detections, and the reward over any
`Detector` (images → detections, each with its class, confidence, box and, where the metadata asks
for a colour, a colour label). No detector ships here: the official Mask2Former needs mmdetection
and mmcv, which do not install in this project's environment (see NO_DETECTOR).

Selection of detections (djghosh13/geneval `evaluation/evaluate_images.py::evaluate_image`, with
the defaults of its `__main__`): per class, detections scoring strictly above `threshold` 0.3
(`counting_threshold` 0.9 for prompts tagged "counting") are kept in descending confidence, at most
`max_objects` 16 of them; then boxes overlapping a more confident box of the same class with IoU
≥ `max_overlap` are dropped — off by default (max_overlap 1.0, as the official). IoU is computed
on pixel boxes with the official "+1" convention (`compute_iou`).

Three verdicts are computed for each image:
- `correct`: the official GenEval rule (`evaluate_images.py::evaluate`), the benchmark's metric.
  Every include entry needs at least `count` detections of its class; its colour and position are
  checked on the `count` most confident of them only: at least `count` must have the colour, and
  each must stand in the relation to every object of the entry it refers to, that entry having
  passed itself. An exclude entry fails when `count` or more of its class are detected.
- `strict_correct` and `score`: Flow-GRPO's reward (yifan123/reward-server
  `reward_server/gen_eval.py::evaluate_reward`, served to yifan123/flow_grpo
  `flow_grpo/rewards.py::geneval_score`, whose `score` is the reward Flow-GRPO trains on, its
  `strict_correct` logged as strict accuracy). It looks at *every* selected detection of a class:
  an include entry passes only with exactly `count` of them, all of the colour asked for, each in
  the relation asked for; exclude entries are not checked. `score` is the mean of partial credits:
  per include entry 1 − |count − found| / count (negative when more than twice `count` are found);
  then, when the count is wrong and the entry asks for a colour or a position, one 0; else for a
  colour 1 − |count − of that colour| / count; for a position 0 when the referred entry failed,
  and otherwise a 1 — preceded by a 0 when some pair is not in the relation (the official appends
  both in that case; reproduced as is). No entries → score 0.
- `clause_accuracy` (this project's diagnostic): the fraction of include and exclude entries that
  pass under the official rule (1 when there are none).

Relative position (`evaluate_images.py::relative_position`): with box centres c and sizes
(w, h), offset = c_a − c_b; each component is shrunk toward 0 by `position_threshold` 0.1 × the
summed sizes of both boxes along that axis (never past 0); no relation when both shrunk
components are below 1e-3 in magnitude; otherwise, dividing the shrunk offset by the length of the
unshrunk one, A is "left of" B for dx < −0.5, "right of" for dx > 0.5, "above" for dy < −0.5 and
"below" for dy > 0.5 (image coordinates: y grows downward). Several relations may hold at once.

Ties in confidence keep the detector's order (the official uses numpy's unstable argsort).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch

from rewards.base import Metadata, Reward, WeightFile, register_reward

COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
TAGS = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
RELATIONS = ("left of", "right of", "above", "below")

# evaluate_images.py `__main__` defaults (--options threshold=, counting_threshold=, ...).
THRESHOLD = 0.3
COUNTING_THRESHOLD = 0.9
MAX_OBJECTS = 16
MAX_OVERLAP = 1.0
POSITION_THRESHOLD = 0.1

Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class Detection:
    """One detected object: `label` (a GenEval class name, e.g. "dog"), `score` (confidence in [0, 1]),
    `box` (x1, y1, x2, y2 in pixels), an optional `mask` (any array; unused by the rules) and
    `color` (one of COLORS, as the detector's colour classifier names it; None when not classified)."""

    label: str
    score: float
    box: Box
    color: str | None = None
    mask: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if len(self.box) != 4:
            raise ValueError(f"a detection's box is (x1, y1, x2, y2), got {self.box!r}")
        if self.color is not None and self.color not in COLORS:
            raise ValueError(f"detection colour {self.color!r} is not one of GenEval's colours {COLORS}")


class Detector(Protocol):
    """Images → per image, its detections.

    `images`: float [B, C, H, W] in [0, 1] (the reward's input); `metadata`: the B prompts'
    metadata, so that a detector classifies colours only where an include entry asks for one (the
    official classifies each needed detection's crop, masked onto grey #999, with CLIP ViT-L-14
    zero-shot over COLORS). Boxes are in pixels of the image as given.
    """

    def __call__(self, images: torch.Tensor, metadata: Sequence[Metadata]) -> list[list[Detection]]: ...


_DETECTORS: dict[str, Callable[..., Detector]] = {}


def register_detector(name: str) -> Callable[[Callable[..., Detector]], Callable[..., Detector]]:
    """Decorator: make a detector class (or factory) buildable as `build_detector(name, **options)`.

    A class may define `required_files(**options) -> list[WeightFile]` (as rewards do); the geneval
    reward then reports those files as its own.
    """

    def decorator(factory: Callable[..., Detector]) -> Callable[..., Detector]:
        if name in _DETECTORS and _DETECTORS[name] is not factory:
            raise ValueError(f"a detector named {name!r} is already registered ({_DETECTORS[name]})")
        _DETECTORS[name] = factory
        return factory

    return decorator


def known_detectors() -> list[str]:
    return sorted(_DETECTORS)


NO_DETECTOR = (
    "the geneval reward needs an object detector, and {what}. GenEval's own is Mask2Former "
    "(mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco, mmdetection 2.x on mmcv-full 1.7) with CLIP ViT-L-14 "
    "(open_clip, 'openai' weights) for colours. It runs on a CUDA machine with a Python and PyTorch that mmcv "
    "has wheels for (GenEval: Python 3.9, torch 1.12.1+cu113, mmcv-full 1.7.1; Flow-GRPO's reward server: "
    "Python 3.10, torch 2.1.2+cu121) — not in this project's environment (Python 3.11, torch 2.14), for "
    "which mmcv has no wheel and its source build fails. Install it there, wrap it as a "
    "rewards.geneval.Detector, register it with @register_detector(NAME) and build geneval with "
    "detector=NAME (or pass the detector object)"
)


def build_detector(name: str, **options: Any) -> Detector:
    if name not in _DETECTORS:
        known = ", ".join(known_detectors()) or "none"
        raise ValueError(NO_DETECTOR.format(what=f"no detector {name!r} is registered (known: {known})"))
    return _DETECTORS[name](**options)


# --- the rules ------------------------------------------------------------------------------


def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """IoU of two pixel boxes (x1, y1, x2, y2), counting both end pixels (`compute_iou`'s +1)."""

    def area(box: Sequence[float]) -> float:
        return max(box[2] - box[0] + 1, 0) * max(box[3] - box[1] + 1, 0)

    inter = area((max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])))
    union = area(a) + area(b) - inter
    return inter / union if union else 0.0


def select_objects(
    detections: Sequence[Detection],
    tag: str,
    threshold: float = THRESHOLD,
    counting_threshold: float = COUNTING_THRESHOLD,
    max_objects: int = MAX_OBJECTS,
    max_overlap: float = MAX_OVERLAP,
) -> dict[str, list[Detection]]:
    """Class name → its kept detections, most confident first (classes with none left out)."""
    cutoff = counting_threshold if tag == "counting" else threshold
    by_class: dict[str, list[Detection]] = {}
    for detection in detections:
        by_class.setdefault(detection.label, []).append(detection)
    objects = {}
    for label, candidates in by_class.items():
        ranked = sorted((d for d in candidates if d.score > cutoff), key=lambda d: -d.score)[:max_objects]
        kept: list[Detection] = []
        while ranked:
            best = ranked.pop(0)
            kept.append(best)
            if max_overlap != 1:
                ranked = [d for d in ranked if box_iou(best.box, d.box) < max_overlap]
        if kept:
            objects[label] = kept
    return objects


def relative_position(a: Box, b: Box, position_threshold: float = POSITION_THRESHOLD) -> set[str]:
    """The relations ("left of", "right of", "above", "below") box a stands in to box b."""
    offset = ((a[0] + a[2]) / 2 - (b[0] + b[2]) / 2, (a[1] + a[3]) / 2 - (b[1] + b[3]) / 2)
    sizes = (abs(a[2] - a[0]) + abs(b[2] - b[0]), abs(a[3] - a[1]) + abs(b[3] - b[1]))
    shrunk = [math.copysign(max(abs(o) - position_threshold * s, 0.0), o) for o, s in zip(offset, sizes, strict=True)]
    if all(abs(value) < 1e-3 for value in shrunk):
        return set()
    length = math.hypot(*offset)
    dx, dy = shrunk[0] / length, shrunk[1] / length
    relations = set()
    if dx < -0.5:
        relations.add("left of")
    if dx > 0.5:
        relations.add("right of")
    if dy < -0.5:
        relations.add("above")
    if dy > 0.5:
        relations.add("below")
    return relations


def _colors(objects: Sequence[Detection], label: str) -> list[str]:
    missing = [d for d in objects if d.color is None]
    if missing:
        raise ValueError(f"the metadata asks for the colour of {label!r}, but the detector gave no colour for "
                         f"{len(missing)} of its detections; a Detector must set Detection.color there")
    return [d.color for d in objects]  # type: ignore[misc]


def _position(entry: Mapping[str, Any], index: int) -> tuple[str, int]:
    relation, target = entry["position"]
    if relation not in RELATIONS:
        raise ValueError(f"include entry {index}: position {relation!r} is not one of {RELATIONS}")
    if not 0 <= int(target) < index:
        raise ValueError(f"include entry {index}: position refers to entry {target}, which must come before it")
    return relation, int(target)


def _all_in_relation(objects: Sequence[Detection], targets: Sequence[Detection], relation: str,
                     position_threshold: float) -> bool:
    return all(relation in relative_position(o.box, t.box, position_threshold) for o in objects for t in targets)


@dataclass(frozen=True)
class Verdict:
    """The three verdicts on one image (see the module's docstring) and the official rule's reasons."""

    correct: bool
    strict_correct: bool
    score: float
    clause_accuracy: float
    reasons: tuple[str, ...] = ()


def evaluate_official(
    objects: Mapping[str, Sequence[Detection]], metadata: Metadata, position_threshold: float = POSITION_THRESHOLD
) -> tuple[bool, float, list[str]]:
    """GenEval's rule (`evaluate_images.py::evaluate`): (correct, fraction of entries passing, reasons)."""
    reasons: list[str] = []
    passed: list[bool] = []
    groups: list[Sequence[Detection] | None] = []
    for index, entry in enumerate(metadata.get("include", [])):
        label, count = entry["class"], int(entry["count"])
        found = list(objects.get(label, []))[:count]
        ok = len(found) >= count
        if not ok:
            reasons.append(f"expected {label}>={count}, found {len(found)}")
        if ok and "color" in entry:
            matching = _colors(found, label).count(entry["color"])
            if matching < count:
                ok = False
                reasons.append(f"expected {entry['color']} {label}>={count}, found {matching} {entry['color']}")
        if ok and "position" in entry:
            relation, target = _position(entry, index)
            if groups[target] is None:
                ok = False
                reasons.append(f"no target for {label} to be {relation}")
            elif not _all_in_relation(found, groups[target], relation, position_threshold):  # type: ignore[arg-type]
                ok = False
                reasons.append(f"expected {label} {relation} target")
        groups.append(found if ok else None)
        passed.append(ok)
    for entry in metadata.get("exclude", []):
        label, count = entry["class"], int(entry["count"])
        present = len(objects.get(label, []))
        passed.append(present < count)
        if present >= count:
            reasons.append(f"expected {label}<{count}, found {present}")
    accuracy = sum(passed) / len(passed) if passed else 1.0
    return all(passed), accuracy, reasons


def evaluate_flow_grpo(
    objects: Mapping[str, Sequence[Detection]], metadata: Metadata, position_threshold: float = POSITION_THRESHOLD
) -> tuple[bool, float]:
    """Flow-GRPO's rule (reward-server `gen_eval.py::evaluate_reward`): (strict_correct, score)."""
    correct = True
    credits: list[float] = []
    groups: list[Sequence[Detection] | None] = []
    for index, entry in enumerate(metadata.get("include", [])):
        label, count = entry["class"], int(entry["count"])
        found = list(objects.get(label, []))
        credits.append(1 - abs(count - len(found)) / count)
        ok = len(found) == count
        if not ok:
            if "color" in entry or "position" in entry:
                credits.append(0.0)
        else:
            if "color" in entry:
                matching = _colors(found, label).count(entry["color"])
                credits.append(1 - abs(count - matching) / count)
                ok = matching == count
            if ok and "position" in entry:
                relation, target = _position(entry, index)
                if groups[target] is None:
                    ok = False
                    credits.append(0.0)
                else:
                    if not _all_in_relation(found, groups[target], relation, position_threshold):  # type: ignore[arg-type]
                        ok = False
                        credits.append(0.0)
                    credits.append(1.0)
        correct = correct and ok
        groups.append(found if ok else None)
    return correct, (sum(credits) / len(credits) if credits else 0.0)


def check_metadata(metadata: Metadata) -> None:
    """ValueError naming what a GenEval metadata entry lacks."""
    if not isinstance(metadata.get("tag"), str):
        raise ValueError(f"GenEval metadata needs a 'tag' (one of {TAGS}), got {dict(metadata)!r}; "
                         f"use a GenEval .jsonl prompt set (evaluation_metadata.jsonl's format)")
    for key in ("include", "exclude"):
        for index, entry in enumerate(metadata.get(key, [])):
            if not isinstance(entry, Mapping) or "class" not in entry or "count" not in entry:
                raise ValueError(f"GenEval {key} entry {index} needs 'class' and 'count', got {entry!r}")
            if int(entry["count"]) < 1:
                raise ValueError(f"GenEval {key} entry {index} needs a count of at least 1, got {entry['count']!r}")
            if entry.get("color") is not None and entry["color"] not in COLORS:
                raise ValueError(f"GenEval {key} entry {index}: colour {entry['color']!r} is not one of {COLORS}")


def check_metadatas(metadata: Sequence[Metadata]) -> None:
    """`check_metadata` of every prompt's metadata; the ValueError names the first bad prompt's index."""
    for index, entry in enumerate(metadata):
        try:
            check_metadata(entry)
        except (TypeError, ValueError) as error:  # TypeError: a count or entry list of the wrong type
            raise ValueError(f"prompt {index}: {error}") from None


def judge(
    detections: Sequence[Detection],
    metadata: Metadata,
    threshold: float = THRESHOLD,
    counting_threshold: float = COUNTING_THRESHOLD,
    max_objects: int = MAX_OBJECTS,
    max_overlap: float = MAX_OVERLAP,
    position_threshold: float = POSITION_THRESHOLD,
) -> Verdict:
    """All verdicts on one image, from its raw detections and its prompt's metadata."""
    check_metadata(metadata)
    objects = select_objects(detections, metadata["tag"], threshold, counting_threshold, max_objects, max_overlap)
    correct, accuracy, reasons = evaluate_official(objects, metadata, position_threshold)
    strict, score = evaluate_flow_grpo(objects, metadata, position_threshold)
    return Verdict(correct, strict, score, accuracy, tuple(reasons))


# --- the reward -----------------------------------------------------------------------------

Objective = Literal["score", "strict_correct", "correct"]


@register_reward("geneval")
class GenEval(Reward):
    """GenEval over a detector: Flow-GRPO's partial-credit `score` by default, or a 0/1 verdict.

    details per sample: `correct` (official GenEval), `strict_correct` and `score` (Flow-GRPO),
    `clause_accuracy`, `tag` (index in TAGS, −1 for another tag; for per-task breakdowns).
    """

    reads_uint8 = False  # detectors are pluggable and may read the float pixels

    def __init__(
        self,
        detector: str | Detector | None = None,
        detector_options: Mapping[str, Any] | None = None,
        objective: Objective = "score",
        threshold: float = THRESHOLD,
        counting_threshold: float = COUNTING_THRESHOLD,
        max_objects: int = MAX_OBJECTS,
        max_overlap: float = MAX_OVERLAP,
        position_threshold: float = POSITION_THRESHOLD,
    ) -> None:
        """`detector`: a registered detector's name or a Detector; `objective`: the reward reported as the score."""
        if objective not in ("score", "strict_correct", "correct"):
            raise ValueError(f"objective must be 'score', 'strict_correct' or 'correct', got {objective!r}")
        if max_objects < 1:
            raise ValueError(f"max_objects must be at least 1, got {max_objects}")
        if detector is None:
            known = ", ".join(known_detectors()) or "none"
            raise RuntimeError(NO_DETECTOR.format(what=f"none was given (registered detectors: {known})"))
        if isinstance(detector, str):
            detector = build_detector(detector, **dict(detector_options or {}))
        elif detector_options:
            raise ValueError("detector_options apply to a detector given by name, not to a Detector object")
        if not callable(detector):
            raise TypeError(f"detector must be a registered name or a Detector, got {type(detector).__name__}")
        self.detector = detector
        self.objective = objective
        self.rule_options = {
            "threshold": threshold,
            "counting_threshold": counting_threshold,
            "max_objects": max_objects,
            "max_overlap": max_overlap,
            "position_threshold": position_threshold,
        }

    @classmethod
    def required_files(cls, **options: Any) -> list[WeightFile]:
        """The named detector's files, when it declares them. No detector at all is refused here too, so
        a job configured without one stops before anything starts."""
        name = options.get("detector")
        if name is None:
            raise ValueError(NO_DETECTOR.format(what="reward.options.geneval.detector names none"))
        factory = _DETECTORS.get(name) if isinstance(name, str) else None
        declare = getattr(factory, "required_files", None)
        return list(declare(**dict(options.get("detector_options") or {}))) if declare else []

    @classmethod
    def check_prompts(cls, prompts: Sequence[str], metadata: Sequence[Metadata]) -> None:
        """Every prompt needs GenEval metadata (`check_metadata`), as `verdicts` reads it: a text prompt set
        has none."""
        check_metadatas(metadata)

    def verdicts(self, images: torch.Tensor, metadata: Sequence[Metadata]) -> list[Verdict]:
        check_metadatas(metadata)
        detections = self.detector(images, metadata)
        if len(detections) != len(metadata):
            raise RuntimeError(f"the detector returned {len(detections)} detection lists for {len(metadata)} images")
        return [judge(found, entry, **self.rule_options) for found, entry in zip(detections, metadata, strict=True)]

    def _compute(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Metadata]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        verdicts = self.verdicts(images, metadata)

        def column(values: Sequence[float]) -> torch.Tensor:
            return torch.tensor([float(v) for v in values], dtype=torch.float64)

        details = {
            "correct": column([v.correct for v in verdicts]),
            "strict_correct": column([v.strict_correct for v in verdicts]),
            "score": column([v.score for v in verdicts]),
            "clause_accuracy": column([v.clause_accuracy for v in verdicts]),
            "tag": column([TAGS.index(entry["tag"]) if entry["tag"] in TAGS else -1 for entry in metadata]),
        }
        return details[self.objective].clone(), details
