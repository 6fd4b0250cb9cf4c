"""ocr (from Flow-GRPO): how closely the text an OCR engine reads in the image matches the quoted text.

The official reward is `OcrScorer.__call__` in yifan123/flow_grpo `flow_grpo/ocr.py` (PaddleOCR
with `use_angle_cls=False, lang="en"`, called as `ocr.ocr(image, cls=False)`, and
`Levenshtein.distance`); `flow_grpo/rewards.py::ocr_score` turns the [0, 1] images into uint8 HWC
arrays first. Per image:

    target     = the prompt's text between its first and second ASCII double quote (`"`),
                 i.e. `prompt.split('"')[1]`: `a sign that says "Open Now"` → `Open Now`;
                 with a single `"` the target runs to the end of the prompt
    recognised = every string the OCR engine returns, concatenated in its reading order
                 (top to bottom, left to right)
    both normalised: lowercased, and every space character " " removed (other whitespace kept)
    distance   = 0 if the normalised target is a substring of the normalised recognised text,
                 else the Levenshtein distance between the two (insertions, deletions and
                 substitutions each cost 1), then capped at len(target)
    reward     = 1 − distance / len(target)   ∈ [0, 1]; 1 for a perfect read, 0 for none at all

Edge cases, decided here (the official code crashes on them): a prompt with no `"` raises
ValueError naming the prompt (the official `split('"')[1]` raises IndexError), and so does a
quoted text that is empty after normalisation (the official code divides by zero); `check_prompts`
applies both rules to a whole prompt set before a job starts. The official
code also catches any OCR failure and scores it 0; here such errors propagate instead.

The OCR engine is RapidOCR (`rapidocr_onnxruntime`): the PaddleOCR PP-OCRv4 detector and
recogniser exported to ONNX and shipped inside its wheel, so nothing is downloaded. It is set up as
PaddleOCR 2.x's defaults (`tools/infer/utility.py::init_args`, documented in PaddleOCR
`doc/doc_en/inference_args_en.md`): no angle classifier, detector input's longest side limited to
960, DB thresholds 0.3 / box 0.6, unclip ratio 1.5, no dilation, and recognitions below
`drop_score` 0.5 dropped. One difference remains: PaddleOCR's `lang="en"` recogniser is
`en_PP-OCRv4_rec` (digits, Latin letters, punctuation), while the wheel ships the Chinese+English
`ch_PP-OCRv4_rec`; point `rec_model_path` (and `rec_keys_path`, when the keys are not embedded in
the model) at an ONNX export of the English model to match it exactly.

Images are converted as Flow-GRPO does (round(x · 255) after clamping to [0, 1]); grey images are
repeated to three channels; and the channels are reversed to BGR, the order RapidOCR (like
OpenCV) expects of an array. (Flow-GRPO hands PaddleOCR RGB arrays, which it too reads as BGR; the
channels are put in the right order here.) `details` reports per sample `edit_distance` (the
capped distance), `target_length` and `recognised_length` (characters after normalisation).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rewards.base import Metadata, Reward, WeightFile, register_reward, require_files
from rewards.uint8_images import to_uint8

RAPIDOCR_PACKAGE = "rapidocr_onnxruntime"
RAPIDOCR_SOURCE = "the rapidocr-onnxruntime==1.4.4 wheel (pip install rapidocr-onnxruntime==1.4.4)"
DEFAULT_DET_MODEL = "ch_PP-OCRv4_det_infer.onnx"
DEFAULT_REC_MODEL = "ch_PP-OCRv4_rec_infer.onnx"
DEFAULT_CLS_MODEL = "ch_ppocr_mobile_v2.0_cls_infer.onnx"

# PaddleOCR 2.x defaults (tools/infer/utility.py::init_args), which the official reward runs with.
PADDLEOCR_DEFAULTS: dict[str, Any] = {
    "text_score": 0.5,  # drop_score: recognitions scoring below it are discarded
    "use_cls": False,  # use_angle_cls=False in flow_grpo/ocr.py
    "det_limit_side_len": 960,
    "det_limit_type": "max",
    "det_thresh": 0.3,
    "det_box_thresh": 0.6,
    "det_unclip_ratio": 1.5,
    "det_donot_use_dilation": True,  # use_dilation=False
    "det_score_mode": "fast",
}
CUDA_PROVIDER = "CUDAExecutionProvider"


def quoted_text(prompt: str) -> str:
    """The target text of an OCR prompt: what `prompt.split('"')[1]` gives (flow_grpo/ocr.py).

    The text between the first and the second ASCII double quote, or from the first quote to the
    end when there is only one. ValueError when the prompt has no double quote at all.
    """
    parts = prompt.split('"')
    if len(parts) < 2:
        raise ValueError(f"the ocr reward needs the target text in double quotes in the prompt, got {prompt!r}")
    return parts[1]


def ocr_targets(prompts: Sequence[str]) -> list[str]:
    """The quoted target text of every prompt; ValueError naming the first prompt (its index) without one,
    or whose quoted text is empty once spaces are removed."""
    found = []
    for i, prompt in enumerate(prompts):
        try:
            target = quoted_text(prompt)
        except ValueError as error:
            raise ValueError(f"prompt {i}: {error}") from None
        if not normalise(target):
            raise ValueError(f"prompt {i}: the quoted text {target!r} is empty once spaces are removed: "
                             f"nothing to read in {prompt!r}")
        found.append(target)
    return found


def normalise(text: str) -> str:
    """Lowercased, with every space character removed (as flow_grpo/ocr.py: `replace(" ", "").lower()`)."""
    return text.replace(" ", "").lower()


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance: the fewest single-character insertions, deletions or substitutions turning a into b.

    Dynamic programming over prefixes, keeping one row: row[j] is the distance between the first
    i characters of a and the first j of b. O(len(a) · len(b)) time, O(len(b)) memory.
    """
    if len(a) < len(b):
        a, b = b, a
    row = list(range(len(b) + 1))
    for i, char_a in enumerate(a, start=1):
        diagonal, row[0] = row[0], i
        for j, char_b in enumerate(b, start=1):
            above = row[j]
            row[j] = min(above + 1, row[j - 1] + 1, diagonal + (char_a != char_b))
            diagonal = above
    return row[-1]


def ocr_distance(target: str, recognised: str) -> int:
    """The official capped distance: 0 when the normalised target occurs in the normalised recognised
    text, else their edit distance, at most len(normalised target)."""
    target, recognised = normalise(target), normalise(recognised)
    if target in recognised:
        return 0
    return min(edit_distance(recognised, target), len(target))


def ocr_score(target: str, recognised: str) -> float:
    """1 − ocr_distance / len(normalised target); ValueError for a target that normalises to ''."""
    length = len(normalise(target))
    if length == 0:
        raise ValueError(f"the quoted text {target!r} is empty once spaces are removed: nothing to read")
    return 1.0 - ocr_distance(target, recognised) / length


def to_bgr_uint8(image: torch.Tensor) -> np.ndarray:
    """One image [C, H, W] in [0, 1] as a contiguous uint8 BGR array [H, W, 3] (grey repeated)."""
    pixels = to_uint8(image.cpu())
    if pixels.shape[0] == 1:
        pixels = pixels.expand(3, -1, -1)
    return np.ascontiguousarray(pixels.flip(0).permute(1, 2, 0).numpy())


def cuda_available() -> bool:
    """Whether onnxruntime here can run on a GPU (the onnxruntime-gpu build, with CUDA present)."""
    import onnxruntime

    return CUDA_PROVIDER in onnxruntime.get_available_providers()


def _device_index(device: str | torch.device | None) -> int | None:
    """None for the CPU, the CUDA device index otherwise; None → CUDA 0 when onnxruntime has CUDA."""
    if device is None:
        return 0 if cuda_available() else None
    device = torch.device(device)
    if device.type == "cpu":
        return None
    if device.type != "cuda":
        raise ValueError(f"the ocr reward runs on 'cpu' or 'cuda[:N]', got {str(device)!r}")
    if not cuda_available():
        raise RuntimeError(
            f"device {str(device)!r} asked for, but onnxruntime here has no {CUDA_PROVIDER}; "
            "install the onnxruntime-gpu build matching the CUDA version (in place of onnxruntime), "
            "or use device='cpu' (or None: CUDA when available, else the CPU)"
        )
    return device.index or 0


@register_reward("ocr")
class OcrReward(Reward):
    """1 − (capped edit distance between the quoted text and the OCR'd text) / len(quoted text)."""

    reads_uint8 = True  # the OCR engine reads 8-bit BGR arrays (`to_bgr_uint8`), as flow_grpo's ocr_score

    def __init__(
        self,
        device: str | torch.device | None = None,
        batch_size: int = 6,
        num_threads: int | None = None,
        text_score: float = PADDLEOCR_DEFAULTS["text_score"],
        det_model_path: str | Path | None = None,
        rec_model_path: str | Path | None = None,
        rec_keys_path: str | Path | None = None,
    ) -> None:
        """`device`: None → onnxruntime's CUDA provider when it has one, else the CPU; 'cpu'; 'cuda[:N]'.
        `batch_size`: text crops the recogniser reads per run (PaddleOCR's rec_batch_num, 6).
        `num_threads`: onnxruntime intra-op threads (None → onnxruntime's default).
        `text_score`: recognitions scoring below it are dropped (PaddleOCR's drop_score, 0.5).
        `det_model_path` / `rec_model_path` / `rec_keys_path`: other PP-OCR ONNX models (None → the
        PP-OCRv4 models shipped in the rapidocr-onnxruntime wheel)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if num_threads is not None and num_threads < 1:
            raise ValueError(f"num_threads must be at least 1 (or None), got {num_threads}")
        if not 0.0 <= text_score <= 1.0:
            raise ValueError(f"text_score must lie in [0, 1], got {text_score}")
        require_files(
            "ocr",
            self.required_files(det_model_path=det_model_path, rec_model_path=rec_model_path,
                                rec_keys_path=rec_keys_path),
        )
        from rapidocr_onnxruntime import RapidOCR

        self.device_index = _device_index(device)
        options: dict[str, Any] = {**PADDLEOCR_DEFAULTS, "text_score": text_score, "rec_batch_num": batch_size,
                                   "print_verbose": False}
        if num_threads is not None:
            options["intra_op_num_threads"] = num_threads
        if det_model_path is not None:
            options["det_model_path"] = str(det_model_path)
        if rec_model_path is not None:
            options["rec_model_path"] = str(rec_model_path)
        if rec_keys_path is not None:
            options["rec_keys_path"] = str(rec_keys_path)
        if self.device_index is not None:
            options["det_use_cuda"] = options["rec_use_cuda"] = True
        self.engine = RapidOCR(**options)
        if self.device_index:
            self._place_on_cuda(self.device_index)
        self.batch_size = batch_size

    def _place_on_cuda(self, index: int) -> None:
        """Move the detector's and recogniser's onnxruntime sessions to CUDA device `index`.

        RapidOCR 1.4.4 always opens its CUDA sessions on device 0; `set_providers` (onnxruntime's
        public API) reopens them on another device.
        """
        sessions = [self.engine.text_det.infer.session, self.engine.text_rec.session.session]
        for session in sessions:
            session.set_providers([CUDA_PROVIDER, "CPUExecutionProvider"], [{"device_id": index}, {}])

    @classmethod
    def required_files(cls, **options: Any) -> list[WeightFile]:
        """The detector and recogniser ONNX files: the wheel's unless other paths are given."""
        spec = importlib.util.find_spec(RAPIDOCR_PACKAGE)
        models = (
            Path(next(iter(spec.submodule_search_locations))) / "models"
            if spec is not None and spec.submodule_search_locations
            else Path(RAPIDOCR_PACKAGE) / "models"
        )
        files = []
        for key, default in (("det_model_path", DEFAULT_DET_MODEL), ("rec_model_path", DEFAULT_REC_MODEL)):
            given = options.get(key)
            if given is None:
                files.append(WeightFile(models / default, RAPIDOCR_SOURCE))
            else:
                files.append(WeightFile(Path(given), f"{key}: a PP-OCR model exported to ONNX (paddle2onnx)"))
        # RapidOCR opens the angle classifier's session too, though it is never run here.
        files.append(WeightFile(models / DEFAULT_CLS_MODEL, RAPIDOCR_SOURCE))
        if options.get("rec_keys_path") is not None:
            files.append(WeightFile(Path(options["rec_keys_path"]), "rec_keys_path: the recogniser's character list"))
        return files

    def recognise(self, image: torch.Tensor) -> str:
        """Every string the OCR engine reads in one image [C, H, W], concatenated in reading order."""
        result, _ = self.engine(to_bgr_uint8(image), use_cls=False)
        if not result:
            return ""
        return "".join(entry[1] for entry in result)  # entries: [box, text, confidence]

    @classmethod
    def check_prompts(cls, prompts: Sequence[str], metadata: Sequence[Metadata]) -> None:
        """Every prompt must quote a non-empty target text (`ocr_targets`, as `_compute` reads them)."""
        ocr_targets(prompts)

    def _compute(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Metadata]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        distances, target_lengths, recognised_lengths = [], [], []
        for image, target in zip(images, ocr_targets(prompts), strict=True):
            recognised = self.recognise(image)
            distances.append(ocr_distance(target, recognised))
            target_lengths.append(len(normalise(target)))
            recognised_lengths.append(len(normalise(recognised)))
        distance = torch.tensor(distances, dtype=torch.float64)
        target_length = torch.tensor(target_lengths, dtype=torch.float64)
        return 1.0 - distance / target_length, {
            "edit_distance": distance,
            "target_length": target_length,
            "recognised_length": torch.tensor(recognised_lengths, dtype=torch.float64),
        }
