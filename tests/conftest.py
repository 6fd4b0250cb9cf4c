"""Shared fixtures. No test reaches a network: the hub is switched off before anything imports it."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
import torch

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def embedded_policy():
    """The committed embedded model, loaded through the same loader as SD3.5."""
    from diffusion.config import EMBEDDED_MODEL
    from diffusion.loading import load_policy

    return load_policy(EMBEDDED_MODEL)
