"""The official layer rule: substring skips, max(in, out) <= min_dim, 1×1 convs; on the real models.

SD3.5-Large, FLUX.1-dev, SANA 1.6B and Qwen-Image are built on the meta device (no weights, a few seconds) with
their published transformer configs, and the exact lists the rule gives are checked against lists
derived independently from the rule's description.
"""

from __future__ import annotations

import pytest
import torch
from engines import quantize, quantized_layer_names
from torch import nn

from diffusion.families import FLUX, QWEN_IMAGE, SANA, SD3
from diffusion.quant import (
    eligible_conv1x1_names,
    eligible_layers,
    eligible_linear_names,
    is_conv1x1,
)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.Sequential()
        self.norm1.add_module("linear", nn.Linear(32, 64))
        self.norm1_context = nn.Linear(32, 64)
        self.attn = nn.Module()
        self.attn.to_qkv = nn.Linear(32, 96)
        self.attn.proj_out = nn.Linear(48, 32)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(11)])
        self.mha = nn.MultiheadAttention(32, 2)  # its out_proj is an nn.Linear subclass
        self.ff = nn.Conv2d(32, 80, 1)
        self.depthwise = nn.Conv2d(80, 80, 1, groups=80)
        self.spatial = nn.Conv2d(80, 80, 3, padding=1)
        self.strided = nn.Conv2d(80, 80, 1, stride=2)
        self.padded = nn.Conv2d(80, 80, 1, padding=1)
        self.same = nn.Conv2d(16, 16, 1, padding="same")


def linears(model: nn.Module) -> list[str]:
    return [name for name, module in model.named_modules() if type(module) is nn.Linear]


def test_skip_patterns_are_substrings_of_the_qualified_name() -> None:
    model = Net()
    names = eligible_linear_names(model, skip=["norm1", "blocks.1", "qkv"])
    # "norm1" also takes norm1_context; "blocks.1" also takes blocks.10; "qkv" takes attn.to_qkv.
    assert names == [f"blocks.{i}.attn.proj_out" for i in range(11) if i not in (1, 10)]
    assert eligible_linear_names(model, skip=["proj_out", "norm1.", "to_"]) == [
        f"blocks.{i}.norm1_context" for i in range(11)
    ]
    # Case-sensitive, and an empty skip list keeps every plain Linear (never MultiheadAttention's).
    assert eligible_linear_names(model, skip=["NORM1"]) == linears(model)
    assert "mha.out_proj" not in linears(model)


def test_min_dim_skips_layers_whose_larger_dim_is_at_most_min_dim() -> None:
    model = Net()
    block = ["norm1.linear", "norm1_context", "attn.to_qkv", "attn.proj_out"]  # max dims 64, 64, 96, 48
    every = [f"blocks.{i}.{name}" for i in range(11) for name in block]
    assert eligible_linear_names(model, min_dim=0) == every  # 0: no size limit
    assert eligible_linear_names(model, min_dim=47) == every
    assert eligible_linear_names(model, min_dim=48) == [n for n in every if not n.endswith("proj_out")]
    assert eligible_linear_names(model, min_dim=64) == [n for n in every if n.endswith("to_qkv")]
    assert eligible_linear_names(model, min_dim=96) == []


def test_a_string_skip_is_refused() -> None:
    with pytest.raises(TypeError, match="sequence of patterns"):
        eligible_linear_names(Net(), skip="norm1")


def test_only_unpadded_ungrouped_unit_stride_1x1_convs_are_candidates() -> None:
    model = Net()
    assert [name for name, m in model.named_modules() if is_conv1x1(m)] == ["ff", "same"]
    assert eligible_conv1x1_names(model) == ["ff", "same"]
    assert eligible_conv1x1_names(model, min_dim=16) == ["ff"]  # by channels: max(32, 80) > 16 >= max(16, 16)
    assert eligible_conv1x1_names(model, min_dim=80) == []
    assert eligible_conv1x1_names(model, skip=["f"]) == ["same"]
    assert eligible_layers(model).convs == ()  # convs only with conv1x1=True
    both = eligible_layers(model, min_dim=64, conv1x1=True)
    assert both.linears == tuple(f"blocks.{i}.attn.to_qkv" for i in range(11)) and both.convs == ("ff",)
    engine = quantize(model, "nvfp4_w4a16", min_dim=64, conv1x1=True)
    assert quantized_layer_names(engine) == [*both.linears, "ff"]


@pytest.fixture(scope="module")
def sd35_large() -> nn.Module:
    from diffusers import SD3Transformer2DModel

    with torch.device("meta"):
        return SD3Transformer2DModel(
            sample_size=128, patch_size=2, in_channels=16, out_channels=16, num_layers=38,
            attention_head_dim=64, num_attention_heads=38, joint_attention_dim=4096,
            caption_projection_dim=2432, pooled_projection_dim=2048, pos_embed_max_size=192,
            qk_norm="rms_norm", dual_attention_layers=(),
        )


@pytest.fixture(scope="module")
def flux1_dev() -> nn.Module:
    from diffusers import FluxTransformer2DModel

    with torch.device("meta"):
        return FluxTransformer2DModel(
            patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
            num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768,
            guidance_embeds=True, axes_dims_rope=(16, 56, 56),
        )


def test_sd35_large_quantizes_exactly_the_76_image_stream_ffn_linears(sd35_large: nn.Module) -> None:
    quant = SD3.quant
    names = eligible_linear_names(sd35_large, skip=quant.skip, min_dim=quant.min_dim)
    expected = [f"transformer_blocks.{i}.{layer}" for i in range(38) for layer in ("ff.net.0.proj", "ff.net.2")]
    assert len(linears(sd35_large)) == 536
    assert names == expected
    assert eligible_layers(sd35_large, skip=quant.skip, min_dim=quant.min_dim, conv1x1=True).convs == ()


def test_flux1_dev_quantizes_495_of_504_linears(flux1_dev: nn.Module) -> None:
    quant = FLUX.quant
    skipped = {
        "time_text_embed.timestep_embedder.linear_1",
        "time_text_embed.timestep_embedder.linear_2",
        "time_text_embed.guidance_embedder.linear_1",
        "time_text_embed.guidance_embedder.linear_2",
        "time_text_embed.text_embedder.linear_1",
        "time_text_embed.text_embedder.linear_2",
        "context_embedder",
        "x_embedder",
        "norm_out.linear",
    }
    every = linears(flux1_dev)
    assert len(every) == 504 and skipped <= set(every)
    names = eligible_linear_names(flux1_dev, skip=quant.skip, min_dim=quant.min_dim)
    assert names == [name for name in every if name not in skipped]
    assert len(names) == 495 and "proj_out" in names  # 3072 → 64: its larger dim is above 1000


def test_sana_has_no_eligible_linear_and_quantizes_its_ffn_convs() -> None:
    """Diffusers' SANA 1.6B (its default config) has a conv FFN: under SANA's rule no Linear is
    replaced (every block projection is 2240-wide) and the 1×1 convs of the 20 FFNs are. Those convs are the FFN
    that the official SANA script quantizes as Linears in its native LinearFFN model; its flag taken literally
    (`replace_linear_with_te` without `replace_conv1x1`) would quantize nothing here."""
    from diffusers import SanaTransformer2DModel

    with torch.device("meta"):
        sana = SanaTransformer2DModel()
    quant = SANA.quant
    assert quant.conv1x1
    layers = eligible_layers(sana, skip=quant.skip, min_dim=quant.min_dim, conv1x1=quant.conv1x1)
    assert layers.linears == ()
    literal = eligible_layers(sana, skip=quant.skip, min_dim=quant.min_dim, conv1x1=False)
    assert (literal.linears, literal.convs) == ((), ())
    assert layers.convs == tuple(
        f"transformer_blocks.{i}.ff.{conv}" for i in range(20) for conv in ("conv_inverted", "conv_point")
    )
    # The official list names native-SANA modules only; on diffusers' names it would leave the
    # timestep modulation (t_block) and the caption projection (y_embedder) to be quantized.
    official = quant.skip[: quant.skip.index("attn.qkv") + 1]
    assert eligible_linear_names(sana, skip=official, min_dim=quant.min_dim) == [
        "time_embed.linear",
        "caption_projection.linear_1",
    ]


def test_qwen_image_quantizes_exactly_the_240_ffn_linears_of_its_60_blocks() -> None:
    """Qwen/Qwen-Image's transformer config (diffusers' defaults for the class: 60 dual-stream blocks, width
    24 × 128 = 3072, text width 3584): the rule keeps the embedders, the AdaLN modulations, the output
    projection and every 3072×3072 attention projection in high precision, and replaces the FFNs of both
    streams (3072 → 12288 → 3072)."""
    from diffusers import QwenImageTransformer2DModel

    with torch.device("meta"):
        qwen = QwenImageTransformer2DModel(
            patch_size=2, in_channels=64, out_channels=16, num_layers=60, attention_head_dim=128,
            num_attention_heads=24, joint_attention_dim=3584, guidance_embeds=False, axes_dims_rope=(16, 56, 56),
        )
    quant = QWEN_IMAGE.quant
    every = linears(qwen)
    per_block = ("img_mod.1", "txt_mod.1", "attn.to_q", "attn.to_k", "attn.to_v", "attn.add_k_proj",
                 "attn.add_v_proj", "attn.add_q_proj", "attn.to_out.0", "attn.to_add_out", "img_mlp.net.0.proj",
                 "img_mlp.net.2", "txt_mlp.net.0.proj", "txt_mlp.net.2")
    assert sorted(every) == sorted(
        ["img_in", "txt_in", "time_text_embed.timestep_embedder.linear_1",
         "time_text_embed.timestep_embedder.linear_2", "norm_out.linear", "proj_out"]
        + [f"transformer_blocks.{i}.{layer}" for i in range(60) for layer in per_block])
    names = eligible_linear_names(qwen, skip=quant.skip, min_dim=quant.min_dim)
    assert names == [f"transformer_blocks.{i}.{stream}_mlp.{layer}"
                     for i in range(60) for stream in ("img", "txt") for layer in ("net.0.proj", "net.2")]
    assert eligible_layers(qwen, skip=quant.skip, min_dim=quant.min_dim, conv1x1=True).convs == ()
