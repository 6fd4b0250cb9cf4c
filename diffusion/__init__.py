"""Diffusion models, samplers, quantized exploration engines and the embedded world."""
