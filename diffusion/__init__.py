"""Diffusion models, samplers, quantized exploration engines and the embedded world.

Importing any part of the project imports this package first, so torchvision is made importable
here, once per process, before transformers, diffusers, open_clip or timm reach for it.
"""

from diffusion.torchvision_import import prepare_torchvision

prepare_torchvision()
