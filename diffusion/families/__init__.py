"""Model families: the registry of what differs between SD3, FLUX, SANA and Qwen-Image (`base.Family`)."""

from __future__ import annotations

from diffusion.families.base import Conditioning, Family, QuantPolicy
from diffusion.families.flux import FLUX
from diffusion.families.qwen_image import QWEN_IMAGE
from diffusion.families.sana import SANA
from diffusion.families.sd3 import SD3

FAMILIES: dict[str, Family] = {f.name: f for f in (SD3, FLUX, SANA, QWEN_IMAGE)}


def family_for_transformer(class_name: str) -> Family:
    """The family whose transformer class is `class_name`."""
    for family in FAMILIES.values():
        if family.transformer_class == class_name:
            return family
    known = ", ".join(f"{f.transformer_class} ({f.name})" for f in FAMILIES.values())
    raise ValueError(f"no model family for transformer class {class_name!r}; known: {known}")


__all__ = [
    "FAMILIES", "FLUX", "QWEN_IMAGE", "SANA", "SD3", "Conditioning", "Family", "QuantPolicy", "family_for_transformer",
]
