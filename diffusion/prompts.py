"""Prompt sets: the embedded digit prompts, or a text file with one prompt per line."""

from __future__ import annotations

from pathlib import Path

from diffusion.embedded.data import heldout_prompts, train_prompts


def load_prompts(source: str, *, heldout: bool = False) -> list[str]:
    """The prompts of a source: 'embedded' (training or held-out digit prompts) or a UTF-8 text file."""
    if source == "embedded":
        return heldout_prompts() if heldout else train_prompts()
    path = Path(source)
    if path.is_dir():
        raise IsADirectoryError(f"prompt file {path} is a directory; name a text file, one prompt per line")
    if not path.is_file():
        raise FileNotFoundError(f"prompt file {path} does not exist (use 'embedded' or a text file, one per line)")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")  # a byte-order mark some editors write is no prompt
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ValueError(
            f"prompt file {path} is not UTF-8 text (byte 0x{data[exc.start]:02x} at line {line}); save it as UTF-8"
        ) from None
    prompts = [line.strip() for line in text.splitlines() if line.strip()]
    if not prompts:
        raise ValueError(f"prompt file {path} holds no prompts (it is empty or only whitespace); write one per line")
    return prompts
