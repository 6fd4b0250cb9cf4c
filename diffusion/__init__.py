"""Diffusion models, samplers, quantized exploration engines and the embedded world."""

import logging


def _quiet_torchao_import_noise() -> None:
    """Drop two warnings that importing torchao (the FP8 engine's library, which diffusers imports whenever it
    is installed) prints in every process, about nothing this project does: diffusers 0.42 probes torchao for
    tensor classes of its old checkpoint format (none is loaded here), and torch logs torchao's registration
    of Enum types with its pytree as deprecated."""
    logging.getLogger("diffusers.quantizers.torchao.torchao_quantizer").setLevel(logging.ERROR)
    logging.getLogger("torch.utils._pytree").addFilter(
        lambda record: "is an Enum subclass and is now natively supported" not in record.getMessage())


_quiet_torchao_import_noise()
