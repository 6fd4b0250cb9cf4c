"""Prompt sets: the embedded digit prompts, or a text file with one prompt per line."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from diffusion.embedded.data import heldout_prompts, train_prompts


class PromptConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: str = Field("embedded", description="'embedded' (the digit prompts) or a text file, one per line")
    eval_source: str = Field("embedded", description="held-out prompts: 'embedded' or a text file")
    per_iteration: int = Field(8, ge=1, description="prompt slots per iteration")
    candidates: int = Field(96, ge=2, description="N: seeds explored per prompt")
    keep: int = Field(24, ge=2, description="K: seeds regenerated and trained on per prompt")


def load_prompts(source: str, *, heldout: bool = False) -> list[str]:
    """The prompts of a source: 'embedded' (training or held-out digit prompts) or a UTF-8 text file."""
    if source == "embedded":
        return heldout_prompts() if heldout else train_prompts()
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"prompt file {path} does not exist (use 'embedded' or a text file, one per line)")
    prompts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not prompts:
        raise ValueError(f"prompt file {path} holds no prompts")
    return prompts
