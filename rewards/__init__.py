"""Rewards: images [B, C, H, W] in [0, 1] + B prompts → float32 scores [B] on the CPU.

    from rewards import build_reward, known_rewards
    reward = build_reward("digit_alignment")          # or "jpeg_compressibility"
    scores = reward(images, prompts)                   # float32 [B]
    extra = reward.details(images, prompts)            # {"accuracy": [B], ...}

Importing the package registers every reward below.
"""

from rewards.aesthetic import Aesthetic
from rewards.base import (
    Metadata,
    Reward,
    WeightFile,
    build_reward,
    known_rewards,
    register_reward,
    require_files,
    validate_inputs,
)
from rewards.clipscore import ClipScore
from rewards.combine import WeightedSum
from rewards.config import RewardConfig, build_reward_from_config
from rewards.digit_alignment import DigitAlignment
from rewards.digit_margin import DigitMargin
from rewards.geneval import Detection, Detector, GenEval, register_detector
from rewards.hpsv2 import HPSv2
from rewards.image_reward import ImageRewardScore
from rewards.jpeg_compressibility import JpegCompressibility
from rewards.ocr import OcrReward
from rewards.pickscore import PickScore

__all__ = [
    "Aesthetic",
    "ClipScore",
    "Detection",
    "Detector",
    "DigitAlignment",
    "DigitMargin",
    "GenEval",
    "HPSv2",
    "ImageRewardScore",
    "JpegCompressibility",
    "Metadata",
    "OcrReward",
    "PickScore",
    "Reward",
    "RewardConfig",
    "WeightFile",
    "WeightedSum",
    "build_reward",
    "build_reward_from_config",
    "known_rewards",
    "register_detector",
    "register_reward",
    "require_files",
    "validate_inputs",
]
