"""pickscore, clipscore, aesthetic: real code paths on tiny random CLIP models saved in the official layouts.

The models are randomly initialised CLIPs with the real architecture (transformers `CLIPModel`), the
tokenizer a real CLIP byte-level BPE with a small vocabulary, written as the official vocab.json +
merges.txt. Each reward is compared with an independent computation of its official formula (the
official processors / torchvision transforms, `CLIPModel` forward, the scorer's arithmetic).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image
from scorer_path import assert_scorer_path_is_exact, off_grid
from sklearn.datasets import load_sample_image

import rewards.aesthetic
import rewards.clipscore
import rewards.pickscore  # the three imports register the rewards
from rewards.base import build_reward, known_rewards
from rewards.clip_embedding import ClipImageTransform
from rewards.state_dicts import convert_to_safetensors

T = torchvision.transforms
from transformers import (  # noqa: E402
    CLIPConfig,
    CLIPImageProcessor,
    CLIPImageProcessorPil,
    CLIPModel,
    CLIPProcessor,
    CLIPTokenizer,
)

MEAN = [0.48145466, 0.4578275, 0.40821073]
STD = [0.26862954, 0.26130258, 0.27577711]
# preprocessor_config.json as openai/clip-vit-large-patch14 ships it (the legacy int sizes).
LEGACY_PROCESSOR_CONFIG = {
    "crop_size": 224, "do_center_crop": True, "do_normalize": True, "do_resize": True,
    "feature_extractor_type": "CLIPFeatureExtractor", "image_mean": MEAN, "image_std": STD,
    "resample": 3, "size": 224,
}
# The same in the current format (as save_pretrained writes it), for the pickscore processor folder.
PROCESSOR_CONFIG = {
    "crop_size": {"height": 224, "width": 224}, "do_center_crop": True, "do_convert_rgb": True, "do_normalize": True,
    "do_rescale": True, "do_resize": True, "image_mean": MEAN, "image_processor_type": "CLIPImageProcessor",
    "image_std": STD, "resample": 3, "rescale_factor": 1 / 255, "size": {"shortest_edge": 224},
}
MERGES = ["t h", "th e</w>", "c a", "ca t</w>", "o f</w>", "p h", "ph o", "pho t", "phot o</w>", "r e", "re d</w>"]
PROMPTS = ["a photo of the cat", "the red cat", "a photo of the cat", "of the photo", "cat " * 100]
MLP_FILE = "sac+logos+ava1-l14-linearMSE.pth"


def bytes_to_unicode() -> list[str]:
    """The 256 printable characters byte-level BPE maps bytes to (CLIP's and GPT-2's table)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    codes, extra = list(printable), 0
    for byte in range(256):
        if byte not in printable:
            codes.append(256 + extra)
            extra += 1
    return [chr(code) for code in codes]


def write_clip_tokenizer(folder: Path) -> CLIPTokenizer:
    """vocab.json + merges.txt of a small CLIP BPE (bytes, bytes + "</w>", the merges, the two specials),
    loaded by `CLIPTokenizer` and saved back (tokenizer_config.json, tokenizer.json) with max length 77."""
    folder.mkdir(parents=True, exist_ok=True)
    chars = bytes_to_unicode()
    tokens = [*chars, *(c + "</w>" for c in chars), *(m.replace(" ", "") for m in MERGES)]
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    (folder / "vocab.json").write_text(json.dumps({token: i for i, token in enumerate(tokens)}))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(MERGES) + "\n")
    tokenizer = CLIPTokenizer.from_pretrained(folder, model_max_length=77)
    tokenizer.save_pretrained(folder)
    return tokenizer


def write_clip_model(folder: Path, tokenizer: CLIPTokenizer, projection_dim: int, hidden_act: str, seed: int) -> None:
    text = {"vocab_size": len(tokenizer), "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
            "num_attention_heads": 4, "max_position_embeddings": 77, "hidden_act": hidden_act,
            "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id}
    vision = {"image_size": 224, "patch_size": 32, "hidden_size": 32, "intermediate_size": 48,
              "num_hidden_layers": 2, "num_attention_heads": 4, "hidden_act": hidden_act}
    torch.manual_seed(seed)
    CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=projection_dim)).save_pretrained(folder)


def aesthetic_mlp() -> torch.nn.Sequential:
    """simple_inference.py's MLP, written out independently of rewards.aesthetic."""
    return torch.nn.Sequential(
        torch.nn.Linear(768, 1024), torch.nn.Dropout(0.2), torch.nn.Linear(1024, 128), torch.nn.Dropout(0.2),
        torch.nn.Linear(128, 64), torch.nn.Dropout(0.1), torch.nn.Linear(64, 16), torch.nn.Linear(16, 1),
    )


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """pickscore/ (+ processor/), clip-vit-large-patch14/, aesthetic/ (the MLP .pth + clip-vit-large-patch14/)."""
    root = tmp_path_factory.mktemp("clip_rewards")
    pickscore, clip_l, aesthetic = root / "pickscore", root / "clip-vit-large-patch14", root / "aesthetic"
    tokenizer = write_clip_tokenizer(pickscore / "processor")
    (pickscore / "processor" / "preprocessor_config.json").write_text(json.dumps(PROCESSOR_CONFIG))
    write_clip_model(pickscore, tokenizer, projection_dim=64, hidden_act="gelu", seed=0)
    write_clip_tokenizer(clip_l)
    (clip_l / "preprocessor_config.json").write_text(json.dumps(LEGACY_PROCESSOR_CONFIG))
    write_clip_model(clip_l, tokenizer, projection_dim=768, hidden_act="quick_gelu", seed=1)
    aesthetic.mkdir()
    torch.manual_seed(2)
    # As the official file: a pickled state dict of simple_inference.py's MLP (its Sequential is `layers`).
    torch.save({f"layers.{k}": v for k, v in aesthetic_mlp().state_dict().items()}, aesthetic / MLP_FILE)
    shutil.copytree(clip_l, aesthetic / "clip-vit-large-patch14")
    return {"pickscore": pickscore, "clipscore": clip_l, "aesthetic": aesthetic}


def photo_crops(height: int, width: int, count: int = 5) -> np.ndarray:
    """`count` different uint8 RGB crops [N, H, W, 3] of the two photographs sklearn ships (427×640)."""
    photos = [load_sample_image("china.jpg"), load_sample_image("flower.jpg")]
    crops = [photos[i % 2][17 * i : 17 * i + height, 41 * i : 41 * i + width] for i in range(count)]
    return np.stack(crops)


def as_float(arrays: np.ndarray) -> torch.Tensor:
    """uint8 [N, H, W, C] → float [N, C, H, W] in [0, 1] (what the rewards receive)."""
    return torch.from_numpy(np.array(arrays)).permute(0, 3, 1, 2).float() / 255.0


def pooled(features) -> torch.Tensor:
    return features if isinstance(features, torch.Tensor) else features.pooler_output


def official_pickscore(folders, arrays: np.ndarray, prompts: list[str], backend: str = "torchvision") -> torch.Tensor:
    """flow_grpo/pickscore_scorer.py::PickScoreScorer.__call__ on PIL images (what pickscore_score passes),
    with transformers 5's default CLIP image processor ("torchvision") or its PIL backend (4.x's default)."""
    processor = CLIPProcessor.from_pretrained(folders["pickscore"] / "processor")
    if backend == "pil":
        processor.image_processor = CLIPImageProcessorPil.from_pretrained(folders["pickscore"] / "processor")
    model = CLIPModel.from_pretrained(folders["pickscore"]).eval()
    images = processor(images=[Image.fromarray(a) for a in arrays], return_tensors="pt")
    texts = processor(text=prompts, padding=True, truncation=True, max_length=77, return_tensors="pt")
    with torch.no_grad():
        image_embs = pooled(model.get_image_features(**images))
        text_embs = pooled(model.get_text_features(**texts))
    image_embs = image_embs / image_embs.norm(p=2, dim=-1, keepdim=True)
    text_embs = text_embs / text_embs.norm(p=2, dim=-1, keepdim=True)
    return (model.logit_scale.exp() * (text_embs @ image_embs.T)).diag() / 26


def official_clipscore(folders, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
    """Sana diffusion/post_training/rewards.py::ClipScorer.__call__ (torchvision transform of the floats)."""
    processor = CLIPProcessor.from_pretrained(folders["clipscore"])
    model = CLIPModel.from_pretrained(folders["clipscore"]).eval()
    tform = T.Compose([T.Resize(224), T.CenterCrop(224), T.Normalize(mean=MEAN, std=STD)])
    texts = processor(text=prompts, padding="max_length", truncation=True, return_tensors="pt")
    with torch.no_grad():
        return model(pixel_values=tform(images), **texts).logits_per_image.diagonal() / 100


def official_aesthetic(folders, arrays: np.ndarray) -> torch.Tensor:
    """flow_grpo/aesthetic_scorer.py::AestheticScorer.__call__ on the uint8 tensors aesthetic_score passes."""
    clip_folder = folders["aesthetic"] / "clip-vit-large-patch14"
    processor = CLIPProcessor.from_pretrained(clip_folder)
    model = CLIPModel.from_pretrained(clip_folder).eval()
    mlp = aesthetic_mlp()
    mlp.load_state_dict({k.removeprefix("layers."): v for k, v in
                         torch.load(folders["aesthetic"] / MLP_FILE, weights_only=True).items()})
    mlp.eval()
    inputs = processor(images=torch.from_numpy(arrays).permute(0, 3, 1, 2), return_tensors="pt")
    with torch.no_grad():
        embed = pooled(model.get_image_features(**inputs))
        embed = embed / torch.linalg.vector_norm(embed, dim=-1, keepdim=True)
        return mlp(embed).squeeze(1)


def build(name: str, folders, **options):
    return build_reward(name, path=folders[name], **{"device": "cpu", **options})


def assert_not_constant(scores: torch.Tensor) -> None:
    """A tiny random model could map every image to the same score; the comparisons would then prove nothing."""
    assert torch.isfinite(scores).all()
    assert scores.max() - scores.min() > 1e-4 * scores.abs().max(), scores


# --------------------------------------------------------------------------- the fixtures are what they claim


def test_tiny_tokenizer_is_a_real_clip_bpe(folders):
    tokenizer = CLIPTokenizer.from_pretrained(folders["clipscore"])
    assert len(tokenizer) == 2 * 256 + len(MERGES) + 2 == 525
    ids = tokenizer("a photo of the cat")["input_ids"]
    vocab = tokenizer.get_vocab()
    assert ids == [vocab["<|startoftext|>"], vocab["a</w>"], vocab["photo</w>"], vocab["of</w>"], vocab["the</w>"],
                   vocab["cat</w>"], vocab["<|endoftext|>"]]
    assert len(tokenizer("cat " * 100, truncation=True, max_length=77)["input_ids"]) == 77


def test_three_rewards_are_registered():
    assert {"pickscore", "clipscore", "aesthetic"} <= set(known_rewards())


# --------------------------------------------------------------------------- preprocessing


def test_processor_style_preprocessing_matches_both_clip_processors_on_a_photograph(folders):
    """Measured on china.jpg (427×640), flower.jpg, and an upscaled small copy, in units of 1/255:
    the default (uint8-pipeline emulation) is ≤ 1/255 from the PIL backend (mean ≈ 1e-4/255: a few
    values one level apart) and ≤ 2/255 from the torchvision backend (mean ≈ 6e-3/255; the two
    backends differ from each other by up to 2/255). Without the uint8 rounding (the smooth path)
    it stays ≤ 1.2/255, mean ≈ 0.28/255: the rounding error itself. A one-pass float bicubic resize
    would be 3/255 off at strong edges (it keeps the overshoot PIL clips between its two passes)."""
    settings = CLIPImageProcessor.from_pretrained(folders["clipscore"]).to_dict()
    backends = {"pil": CLIPImageProcessorPil.from_pretrained(folders["clipscore"]),
                "torchvision": CLIPImageProcessor.from_pretrained(folders["clipscore"])}
    china = load_sample_image("china.jpg")
    assert china.shape == (427, 640, 3)
    photos = [china, load_sample_image("flower.jpg"), np.asarray(Image.fromarray(china).resize((150, 100)))]
    std = torch.tensor(STD).view(1, 3, 1, 1)
    limits = {(True, "pil"): (1.0, 0.002), (True, "torchvision"): (2.0, 0.02),
              (False, "pil"): (1.2, 0.3), (False, "torchvision"): (1.2, 0.3)}
    for photo in photos:
        for quantize in (True, False):
            ours = ClipImageTransform.like_processor(settings, quantize=quantize)(as_float(photo[None]))
            for backend, processor in backends.items():
                official = processor(images=[Image.fromarray(photo)], return_tensors="pt").pixel_values
                assert ours.shape == official.shape == (1, 3, 224, 224)
                levels = (ours - official).abs() * std * 255  # back to uint8 levels
                max_limit, mean_limit = limits[quantize, backend]
                assert levels.max() <= max_limit + 1e-3, (quantize, backend, levels.max())
                assert levels.mean() <= mean_limit, (quantize, backend, levels.mean())


def test_processor_crop_floors_and_torchvision_crop_rounds_the_offset(folders):
    """224×259 needs no resize; the crop offset is 35 / 2: transformers floors it (17), torchvision rounds (18)."""
    settings = CLIPImageProcessor.from_pretrained(folders["clipscore"]).to_dict()
    images = as_float(photo_crops(224, 259, count=2))
    official = CLIPImageProcessorPil.from_pretrained(folders["clipscore"])(
        images=[Image.fromarray(a) for a in photo_crops(224, 259, count=2)], return_tensors="pt").pixel_values
    torch.testing.assert_close(ClipImageTransform.like_processor(settings)(images), official, rtol=0, atol=1e-5)
    flow_grpo = T.Compose([T.Resize(224), T.CenterCrop(224), T.Normalize(mean=MEAN, std=STD)])(images)
    torch.testing.assert_close(ClipImageTransform.like_torchvision(settings)(images), flow_grpo, rtol=0, atol=1e-6)
    assert not torch.allclose(official, flow_grpo, atol=1e-3)


def test_torchvision_style_preprocessing_equals_flow_grpo_transform_and_passes_gradients(folders):
    settings = CLIPImageProcessor.from_pretrained(folders["clipscore"]).to_dict()
    flow_grpo = T.Compose([T.Resize(224), T.CenterCrop(224), T.Normalize(mean=MEAN, std=STD)])
    photo = as_float(load_sample_image("china.jpg")[None])
    smooth = torch.rand(2, 3, 250, 334, generator=torch.Generator().manual_seed(0))  # off the uint8 grid
    for images in (photo, smooth, torch.nn.functional.interpolate(smooth, size=(100, 90))):
        torch.testing.assert_close(ClipImageTransform.like_torchvision(settings)(images), flow_grpo(images),
                                   rtol=0, atol=1e-6)
    for transform in (ClipImageTransform.like_torchvision(settings), ClipImageTransform.like_processor(settings)):
        leaf = smooth.clone().requires_grad_()
        transform(leaf).square().sum().backward()
        assert leaf.grad is not None and leaf.grad.abs().sum() > 0


# --------------------------------------------------------------------------- each reward against its official formula


def test_pickscore_equals_the_official_scorer_where_preprocessing_is_exact(folders):
    arrays = photo_crops(224, 259)  # no resize: the official pixel values are reproduced exactly
    ours = build("pickscore", folders)(as_float(arrays), PROMPTS)
    torch.testing.assert_close(ours, official_pickscore(folders, arrays, PROMPTS), rtol=1e-4, atol=1e-7)
    assert_not_constant(ours)
    assert ours[0] != ours[2]  # same prompt, different image


def test_pickscore_on_resized_photographs_agrees_with_the_official_uint8_path(folders):
    """The official path rounds to uint8 and resizes the 8-bit images (PIL, or torchvision's uint8 path).
    Measured relative gaps on these tiny-model scores (crops of 250×334, 300×300, 180×200): ≤ 8e-5 to
    the PIL processor, ≤ 2.6e-4 to the torchvision one — as far as the two official backends are
    from each other (≤ 2.7e-4). Skipping the uint8 emulation would be 3e-3 off."""
    arrays = photo_crops(250, 334)
    reward = build("pickscore", folders)
    scores, details = reward.score_and_details(as_float(arrays), PROMPTS)
    torch.testing.assert_close(scores, official_pickscore(folders, arrays, PROMPTS, "pil"), rtol=2e-4, atol=1e-6)
    torch.testing.assert_close(scores, official_pickscore(folders, arrays, PROMPTS), rtol=5e-4, atol=1e-6)
    torch.testing.assert_close(scores, reward.embedder.logit_scale * details["cosine"] / 26)
    assert_not_constant(scores)


def test_clipscore_equals_the_official_scorer_on_float_images(folders):
    images = as_float(photo_crops(250, 334))
    noisy = (images + 0.01 * torch.randn(images.shape, generator=torch.Generator().manual_seed(3))).clamp(0, 1)
    reward = build("clipscore", folders)
    for batch in (images, noisy):
        scores, details = reward.score_and_details(batch, PROMPTS)
        torch.testing.assert_close(scores, official_clipscore(folders, batch, PROMPTS), rtol=1e-4, atol=1e-7)
        assert_not_constant(scores)
        model = reward.embedder.model
        torch.testing.assert_close(scores * 100 / model.logit_scale.exp(), details["cosine"])


def test_aesthetic_equals_the_official_scorer_where_preprocessing_is_exact(folders):
    arrays = photo_crops(224, 259)
    ours = build("aesthetic", folders)(as_float(arrays), [""] * 5)
    torch.testing.assert_close(ours, official_aesthetic(folders, arrays), rtol=1e-4, atol=1e-7)
    assert_not_constant(ours)


def test_aesthetic_on_resized_photographs_agrees_with_the_official_uint8_path(folders):
    """Measured ≤ 1e-5 relative (the tiny MLP head varies little; the same crops as pickscore's)."""
    arrays = photo_crops(250, 334)
    ours = build("aesthetic", folders)(as_float(arrays), PROMPTS)  # prompts are ignored
    torch.testing.assert_close(ours, official_aesthetic(folders, arrays), rtol=5e-5, atol=1e-7)
    assert_not_constant(ours)


# --------------------------------------------------------------------------- properties


@pytest.mark.parametrize("name", ["pickscore", "clipscore", "aesthetic"])
def test_batch_size_does_not_change_scores(name, folders):
    images = as_float(photo_crops(250, 334))
    one = build(name, folders, batch_size=1)(images, PROMPTS)
    five = build(name, folders, batch_size=5)(images, PROMPTS)
    torch.testing.assert_close(one, five, rtol=1e-5, atol=1e-7)
    assert one.dtype == torch.float32 and one.shape == (5,)
    assert_not_constant(one)


@pytest.mark.parametrize("name", ["pickscore", "aesthetic"])
def test_float_images_score_as_their_uint8_rounding_as_the_official_path_does(name, folders):
    """The official pickscore / aesthetic round to uint8 first; so do these (exactly)."""
    images = as_float(photo_crops(250, 334))
    smooth = (images + 0.3 / 255 * torch.randn(images.shape, generator=torch.Generator().manual_seed(4))).clamp(0, 1)
    reward = build(name, folders)
    assert not torch.equal(smooth, images)
    assert torch.equal(reward(smooth, PROMPTS), reward((smooth * 255).round() / 255, PROMPTS))


def test_grey_images_score_as_their_rgb_copies(folders):
    grey = as_float(photo_crops(250, 334)).mean(dim=1, keepdim=True)
    for name in ("pickscore", "clipscore", "aesthetic"):
        reward = build(name, folders)
        torch.testing.assert_close(reward(grey, PROMPTS), reward(grey.expand(-1, 3, -1, -1), PROMPTS))


def test_empty_batch_gives_empty_scores(folders):
    assert build("clipscore", folders)(torch.zeros(0, 3, 64, 64), []).shape == (0,)


def test_bfloat16_model_stays_close_to_float32(folders):
    images = as_float(photo_crops(250, 334))
    full = build("clipscore", folders)(images, PROMPTS)
    half = build("clipscore", folders, dtype="bfloat16")(images, PROMPTS)
    assert half.dtype == torch.float32
    torch.testing.assert_close(half, full, rtol=0.05, atol=0.02)


# --------------------------------------------------------------------------- files and options


@pytest.mark.parametrize(
    ("name", "relative", "source"),
    [
        ("pickscore", "model.safetensors", "huggingface.co/yuvalkirstain/PickScore_v1"),
        ("pickscore", "processor/vocab.json", "huggingface.co/laion/CLIP-ViT-H-14-laion2B-s32B-b79K"),
        ("clipscore", "preprocessor_config.json", "huggingface.co/openai/clip-vit-large-patch14"),
        ("aesthetic", MLP_FILE, "christophschuhmann/improved-aesthetic-predictor"),
        ("aesthetic", "clip-vit-large-patch14/config.json", "huggingface.co/openai/clip-vit-large-patch14"),
    ],
)
def test_missing_file_is_named_with_its_source(name, relative, source, folders, tmp_path):
    copy = tmp_path / name
    shutil.copytree(folders[name], copy)
    (copy / relative).unlink()
    with pytest.raises(FileNotFoundError) as error:
        build_reward(name, path=copy, device="cpu")
    assert str(copy / relative) in str(error.value) and source in str(error.value)


def test_required_files_name_the_official_release_files(folders):
    names = {Path(f.path).relative_to(folders["pickscore"]).as_posix()
             for f in rewards.pickscore.PickScore.required_files(path=folders["pickscore"])}
    assert names == {"config.json", "model.safetensors", "processor/preprocessor_config.json",
                     "processor/vocab.json", "processor/merges.txt", "processor/tokenizer_config.json"}
    aesthetic = rewards.aesthetic.Aesthetic.required_files(path=folders["aesthetic"])
    assert [f.path.name for f in aesthetic] == [MLP_FILE, "config.json", "model.safetensors",
                                                  "preprocessor_config.json"]
    assert all(f.path.is_file() for f in aesthetic)


def test_aesthetic_pickle_loads_with_weights_only_and_its_safetensors_twin_scores_identically(folders, tmp_path):
    copy = tmp_path / "aesthetic"
    shutil.copytree(folders["aesthetic"], copy)
    images = as_float(photo_crops(250, 334))
    from_pickle = build_reward("aesthetic", path=copy, device="cpu")(images, PROMPTS)
    twin = convert_to_safetensors(copy / MLP_FILE)
    (copy / MLP_FILE).unlink()
    assert rewards.aesthetic.Aesthetic.required_files(path=copy)[0].path == twin
    assert torch.equal(build_reward("aesthetic", path=copy, device="cpu")(images, PROMPTS), from_pickle)


def test_a_pickle_holding_code_is_refused(folders, tmp_path):
    copy = tmp_path / "aesthetic"
    shutil.copytree(folders["aesthetic"], copy)
    state = torch.load(copy / MLP_FILE, weights_only=True)
    torch.save({**state, "payload": Path("not a tensor")}, copy / MLP_FILE)  # unpickling it would build a Path
    with pytest.raises(ValueError, match="weights_only"):
        build_reward("aesthetic", path=copy, device="cpu")


def test_clip_folder_with_only_a_pickled_pytorch_model_bin_scores_identically(folders, tmp_path):
    """Older releases ship pytorch_model.bin (with the legacy position_ids buffers); it is read weights_only."""
    copy = tmp_path / "pickscore"
    shutil.copytree(folders["pickscore"], copy)
    state = CLIPModel.from_pretrained(copy).state_dict()
    state["text_model.embeddings.position_ids"] = torch.arange(77)[None]
    torch.save(state, copy / "pytorch_model.bin")
    (copy / "model.safetensors").unlink()
    images = as_float(photo_crops(224, 259))
    expected = build("pickscore", folders)(images, PROMPTS)
    assert build_reward("pickscore", path=copy, device="cpu")(images, PROMPTS).equal(expected)
    del state["visual_projection.weight"]
    torch.save(state, copy / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"visual_projection\.weight"):
        build_reward("pickscore", path=copy, device="cpu")


def test_processor_path_option_and_a_foreign_tokenizer(folders, tmp_path):
    processor = tmp_path / "elsewhere"
    shutil.copytree(folders["pickscore"] / "processor", processor)
    images = as_float(photo_crops(224, 259))
    moved = build_reward("pickscore", path=folders["pickscore"], processor_path=processor, device="cpu")
    assert torch.equal(moved(images, PROMPTS), build("pickscore", folders)(images, PROMPTS))
    vocab = json.loads((processor / "vocab.json").read_text())
    (processor / "vocab.json").write_text(json.dumps({**vocab, "extra</w>": len(vocab)}))
    (processor / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match="tokens but the text model expects"):
        build_reward("pickscore", path=folders["pickscore"], processor_path=processor, device="cpu")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"dtype": "float64"}, "dtype"),
        ({"device": "gpu"}, "device"),
    ],
)
def test_bad_options_are_refused(options, message, folders):
    with pytest.raises(ValueError, match=message):
        build("clipscore", folders, **options)


def test_path_is_required():
    for name in ("pickscore", "clipscore", "aesthetic"):
        with pytest.raises((TypeError, ValueError)):
            build_reward(name)
        with pytest.raises(ValueError, match="needs option `path`"):
            build_reward(name, path=None)


@pytest.mark.parametrize("name", ["pickscore", "clipscore", "aesthetic"])
def test_the_scorer_path_scores_as_in_process(name, folders):
    """pickscore and aesthetic round to 8 bits first, so their images travel as uint8; clipscore's
    torchvision transform reads the floats, so its travel as float32."""
    images = off_grid(as_float(photo_crops(250, 334)))
    payload = assert_scorer_path_is_exact(build(name, folders), images, PROMPTS)
    assert payload.dtype == (np.float32 if name == "clipscore" else np.uint8)
