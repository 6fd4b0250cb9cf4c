"""hpsv2 and imagereward: the official formulas, recomputed independently, on tiny random networks of the
official architectures (open_clip's CLIP; image-reward's BLIP ViT + BERT and the MLP head), saved in the
official checkpoint formats; preprocessing against the official transforms on a real photograph."""

from __future__ import annotations

import copy
import json
import math
import shutil
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from scorer_path import assert_scorer_path_is_exact, off_grid
from sklearn.datasets import load_sample_image
from torch import nn

from rewards.base import build_reward, known_rewards
from rewards.blip_compat import bert_model_class, load_blip_modules
from rewards.hpsv2 import HPSv2, build_tokenizer, open_clip_config
from rewards.image_reward import ImageRewardScore
from rewards.state_dicts import convert_to_safetensors

PROMPTS = [
    "a photo of an old temple in china",
    "a red cat on a roof",
    "a painting of a garden with flowers, blue sky",
    "the dog",
    "flowers in the garden of the temple, bright sky, old tree, " * 8,  # longer than 77 and 35 tokens
    "",
]


@pytest.fixture(scope="module")
def photo() -> np.ndarray:
    """A real photograph shipped with scikit-learn: 427 × 640 RGB, uint8."""
    return load_sample_image("china.jpg")


def crops(photo: np.ndarray, height: int, width: int, n: int) -> list[np.ndarray]:
    """`n` different height × width crops of the photograph."""
    rows = np.linspace(0, photo.shape[0] - height, n).astype(int)
    cols = np.linspace(photo.shape[1] - width, 0, n).astype(int)
    return [np.ascontiguousarray(photo[r:r + height, c:c + width]) for r, c in zip(rows, cols, strict=True)]


def as_tensor(arrays: list[np.ndarray]) -> torch.Tensor:
    """uint8 HWC arrays → float [B, 3, H, W] in [0, 1], exactly the pixels of the PIL images."""
    return torch.stack([torch.from_numpy(np.array(a)).permute(2, 0, 1).float() / 255.0 for a in arrays])


def relative_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b).abs() / b.abs().clamp_min(1e-3)).max())


# ---------------------------------------------------------------------------------------------------- hpsv2

HPS_FILE = "HPS_v2.1_compressed.pt"
TINY_CLIP = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 224, "layers": 2, "width": 32, "head_width": 16, "patch_size": 32},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}
TINY_CLIP_NAME = "tiny-hpsv2-test"


@pytest.fixture(scope="module")
def open_clip():
    """open_clip, imported where a test uses it, not at collection: it imports timm, which imports wandb when
    installed (the dev extra), 6 s in every pytest-xdist worker that collects this file."""
    import open_clip

    return open_clip


@pytest.fixture(scope="module")
def hps_folder(tmp_path_factory, open_clip):
    """A random tiny CLIP saved as the official HPS_v2.1_compressed.pt: a pickle of {'state_dict': ...}."""
    folder = tmp_path_factory.mktemp("hpsv2")
    torch.manual_seed(0)
    model = open_clip.model.CLIP(**copy.deepcopy(TINY_CLIP))
    torch.save({"epoch": 1, "state_dict": model.state_dict()}, folder / HPS_FILE)
    return folder


@pytest.fixture(scope="module")
def hps(hps_folder) -> HPSv2:
    return HPSv2(path=hps_folder, device="cpu", model_config=TINY_CLIP)


@pytest.fixture(scope="module")
def hps_official(hps_folder, tmp_path_factory, open_clip):
    """HPSv2's img_score.score, with open_clip's own factory, checkpoint loader, transform and tokenizer:
    score(PIL images, prompts) = diag(image_features @ text_features.T)."""
    config_file = tmp_path_factory.mktemp("open_clip_config") / f"{TINY_CLIP_NAME}.json"
    config_file.write_text(json.dumps(TINY_CLIP))
    open_clip.add_model_config(config_file)
    model, _, _ = open_clip.create_model_and_transforms(TINY_CLIP_NAME, pretrained=str(hps_folder / HPS_FILE),
                                                        output_dict=True)
    model.eval()
    # hpsv2's image_transform(..., resize_longest_max=True) is open_clip 3.3's resize_mode="longest".
    transform = open_clip.image_transform(model.visual.image_size, is_train=False, resize_mode="longest")
    tokenizer = open_clip.get_tokenizer(TINY_CLIP_NAME)

    def score(images: list[Image.Image], prompts: list[str]) -> torch.Tensor:
        with torch.no_grad():
            outputs = model(torch.stack([transform(image) for image in images]), tokenizer(prompts))
            return torch.diagonal(outputs["image_features"] @ outputs["text_features"].T)

    score.transform = transform
    return score


def test_hpsv2_is_registered_and_built_by_name(hps_folder):
    assert "hpsv2" in known_rewards()
    reward = build_reward("hpsv2", path=str(hps_folder), device="cpu", model_config=TINY_CLIP)
    assert reward.name == "hpsv2"
    files = HPSv2.required_files(path=hps_folder, model_config=TINY_CLIP)
    assert [file.path for file in files] == [hps_folder / HPS_FILE]
    assert "xswu/HPSv2" in files[0].source


def test_hpsv2_equals_the_official_formula_on_images_needing_no_resize(hps, hps_official, photo):
    # 224 × 224 images go through both preprocessings untouched, so this isolates the formula.
    arrays = crops(photo, 224, 224, 6)
    scores = hps(as_tensor(arrays), PROMPTS)
    official = hps_official([Image.fromarray(a) for a in arrays], PROMPTS)
    assert relative_gap(scores, official) < 1e-4
    assert scores.std() > 1e-3  # not constant


def test_hpsv2_score_is_a_cosine_without_logit_scale(hps, photo):
    arrays = crops(photo, 224, 224, 3)
    scores = hps(as_tensor(arrays), PROMPTS[:3])
    assert (scores.abs() <= 1.0).all()
    # logit_scale (≈ 14.3 at init) is in the checkpoint and must not multiply the score.
    assert float(hps.model.logit_scale.exp()) > 10


def test_hpsv2_preprocessing_matches_open_clip_longest_resize_and_pad_on_a_photograph(hps, hps_official, photo,
                                                                                       open_clip):
    ours = hps.preprocess(as_tensor([photo]))[0]
    official = hps_official.transform(Image.fromarray(photo))
    assert ours.shape == official.shape == (3, 224, 224)
    # 427 × 640 → 149 × 224, padded with 37 rows above and 38 below: identical black (normalised) bands.
    assert torch.equal(ours[:, :37], official[:, :37]) and torch.equal(ours[:, -38:], official[:, -38:])
    pad_row = official[:, 0]
    assert torch.equal(ours[:, 36], pad_row) and not torch.equal(ours[:, 37], pad_row)  # the image starts at row 37
    gap = (ours - official).abs()
    # Measured: float antialiased bicubic (clamped) vs 8-bit PIL bicubic differ by ≤ 0.0194 after
    # normalisation (1.3 grey levels) and 0.00265 on average (0.18 grey levels).
    assert gap.max() < 0.025 and gap.mean() < 0.004
    # A wrong geometry is far outside that tolerance: open_clip's default (shortest side + centre crop).
    wrong = open_clip.image_transform(224, is_train=False)(Image.fromarray(photo))
    assert (wrong - official).abs().mean() > 0.3


def test_hpsv2_tensor_batch_agrees_with_the_official_pil_path_on_resized_photographs(hps, hps_official, photo):
    arrays = crops(photo, 400, 300, 4)
    scores = hps(as_tensor(arrays), PROMPTS[:4])
    official = hps_official([Image.fromarray(a) for a in arrays], PROMPTS[:4])
    # Measured: 8.4e-5 apart (the preprocessing gap above), on scores spread over 0.11.
    assert (scores - official).abs().max() < 5e-4
    assert scores.max() - scores.min() > 10 * float((scores - official).abs().max())


def test_hpsv2_is_batch_size_invariant_and_varies_with_image_and_prompt(hps_folder, hps, photo):
    images = as_tensor(crops(photo, 256, 256, 5))
    one_at_a_time = HPSv2(path=hps_folder, device="cpu", batch_size=2, model_config=TINY_CLIP)
    torch.testing.assert_close(one_at_a_time(images, PROMPTS[:5]), hps(images, PROMPTS[:5]), atol=1e-6, rtol=1e-5)
    same_prompt = hps(images, [PROMPTS[0]] * 5)
    same_image = hps(images[:1].expand(5, -1, -1, -1), PROMPTS[:5])
    assert same_prompt.std() > 1e-3 and same_image.std() > 1e-3


def test_hpsv2_grey_images_score_as_their_rgb_copies(hps, photo):
    grey = as_tensor(crops(photo, 256, 320, 2)).mean(dim=1, keepdim=True)
    torch.testing.assert_close(hps(grey, PROMPTS[:2]), hps(grey.expand(-1, 3, -1, -1), PROMPTS[:2]), atol=0, rtol=0)


def test_hpsv2_tokenizer_is_open_clips_bundled_vit_h_14_tokenizer(open_clip):
    tokenizer = build_tokenizer(open_clip_config("ViT-H-14"))
    expected = open_clip.get_tokenizer("ViT-H-14")(PROMPTS)
    tokens = tokenizer(PROMPTS)
    assert tokens.shape == (len(PROMPTS), 77)
    assert torch.equal(tokens, expected)
    assert tokens[4, -1] == tokenizer.eot_token_id  # the long prompt is cut, ending in <end_of_text>
    # The BPE vocabulary is a file of the installed open_clip package, not a download.
    assert open_clip.tokenizer.default_bpe().startswith(open_clip.__path__[0])


def test_hpsv2_missing_checkpoint_names_the_file_and_its_source(tmp_path):
    with pytest.raises(FileNotFoundError, match=HPS_FILE) as error:
        HPSv2(path=tmp_path, device="cpu", model_config=TINY_CLIP)
    assert "xswu/HPSv2" in str(error.value) and str(tmp_path) in str(error.value)
    with pytest.raises(ValueError, match="needs option `path`"):
        HPSv2.required_files()


def test_hpsv2_safetensors_twin_gives_identical_scores(hps_folder, hps, photo, tmp_path):
    shutil.copy(hps_folder / HPS_FILE, tmp_path / HPS_FILE)
    twin = convert_to_safetensors(tmp_path / HPS_FILE)
    (tmp_path / HPS_FILE).unlink()  # the twin alone suffices
    assert HPSv2.required_files(path=tmp_path)[0].path == twin
    images = as_tensor(crops(photo, 300, 300, 3))
    from_twin = HPSv2(path=tmp_path, device="cpu", model_config=TINY_CLIP)
    assert torch.equal(from_twin(images, PROMPTS[:3]), hps(images, PROMPTS[:3]))


def test_hpsv2_rejects_bad_options_and_mismatched_checkpoints(hps_folder, tmp_path):
    with pytest.raises(ValueError, match="batch_size"):
        HPSv2(path=hps_folder, batch_size=0, model_config=TINY_CLIP)
    with pytest.raises(ValueError, match="not one of open_clip's built-in configs"):
        HPSv2(path=hps_folder, model_config="ViT-Nope")
    with pytest.raises(ValueError, match="dtype"):
        HPSv2(path=hps_folder, dtype="int8", model_config=TINY_CLIP)
    wider = copy.deepcopy(TINY_CLIP)
    wider["vision_cfg"]["width"] = 64
    with pytest.raises(ValueError, match="does not fit"):
        HPSv2(path=hps_folder, device="cpu", model_config=wider)


def test_hpsv2_bfloat16_stays_close_to_float32(hps_folder, hps, photo):
    images = as_tensor(crops(photo, 224, 224, 3))
    half = HPSv2(path=hps_folder, device="cpu", dtype="bfloat16", model_config=TINY_CLIP)
    torch.testing.assert_close(half(images, PROMPTS[:3]), hps(images, PROMPTS[:3]), atol=0.03, rtol=0)


# ---------------------------------------------------------------------------------------------- imagereward

IR_FILE = "ImageReward.pt"
REWARD_MEAN, REWARD_STD = 0.16717362830052426, 1.0333394966054072  # ImageReward.py, ImageReward.__init__
CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
TINY_VIT = {"width": 48, "depth": 1, "heads": 2, "patch_size": 32}
VOCAB = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ",", ".", "a", "an", "the", "of", "in", "on",
         "with", "photo", "old", "temple", "china", "red", "cat", "roof", "painting", "garden", "flower", "##s",
         "blue", "sky", "dog", "bright", "tree"]


def tiny_med_config() -> dict:
    """med_config.json of the official release, shrunk: BERT with cross-attention (BLIP's med.py)."""
    return {"architectures": ["BertModel"], "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
            "hidden_dropout_prob": 0.1, "hidden_size": 32, "initializer_range": 0.02, "intermediate_size": 64,
            "layer_norm_eps": 1e-12, "max_position_embeddings": 64, "model_type": "bert", "num_attention_heads": 2,
            "num_hidden_layers": 1, "pad_token_id": 0, "type_vocab_size": 2, "vocab_size": len(VOCAB) + 2,
            "encoder_width": 32, "add_cross_attention": True}


def official_tokenizer(folder):
    """blip.py's init_tokenizer, on a local folder."""
    from transformers import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(str(folder), local_files_only=True)
    tokenizer.add_special_tokens({"bos_token": "[DEC]"})
    tokenizer.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
    return tokenizer


@pytest.fixture(scope="module")
def ir_folder(tmp_path_factory):
    """ImageReward.pt (a bare state dict, as released), med_config.json and a bert-base-uncased-style folder."""
    folder = tmp_path_factory.mktemp("imagereward")
    (folder / "bert-base-uncased").mkdir()
    (folder / "bert-base-uncased" / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    (folder / "bert-base-uncased" / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    (folder / "med_config.json").write_text(json.dumps(tiny_med_config()))

    vit, med = load_blip_modules()
    torch.manual_seed(1)
    visual = vit.VisionTransformer(img_size=224, patch_size=32, embed_dim=48, depth=1, num_heads=2)
    config = med.BertConfig.from_json_file(str(folder / "med_config.json"))
    config.encoder_width = 48
    text = bert_model_class()(config=config, add_pooling_layer=False)
    mlp = nn.Sequential(nn.Linear(32, 1024), nn.Dropout(0.2), nn.Linear(1024, 128), nn.Dropout(0.2),
                        nn.Linear(128, 64), nn.Dropout(0.1), nn.Linear(64, 16), nn.Linear(16, 1))
    # ImageReward's own init (std 1/(input_size+1), zero bias) makes a linear stack whose output is
    # ≈ 0 for every input: a constant score. Larger weights (gain 2 per layer) make differences visible.
    for layer in mlp:
        if isinstance(layer, nn.Linear):
            nn.init.normal_(layer.weight, std=2.0 / math.sqrt(layer.in_features))
            nn.init.normal_(layer.bias, std=0.1)
    state = {
        **{f"blip.visual_encoder.{k}": v for k, v in visual.state_dict().items()},
        **{f"blip.text_encoder.{k}": v for k, v in text.state_dict().items()},
        **{f"mlp.layers.{k}": v for k, v in mlp.state_dict().items()},
        # BLIP_Pretrain's contrastive projections are in the release too, unused by the score.
        "blip.vision_proj.weight": torch.randn(256, 48), "blip.vision_proj.bias": torch.zeros(256),
        "blip.text_proj.weight": torch.randn(256, 32), "blip.text_proj.bias": torch.zeros(256),
    }
    torch.save(state, folder / IR_FILE)
    return folder


@pytest.fixture(scope="module")
def ir(ir_folder) -> ImageRewardScore:
    return ImageRewardScore(path=ir_folder, device="cpu", vit=TINY_VIT)


@pytest.fixture(scope="module")
def ir_official(ir_folder):
    """ImageReward.score: one (image, prompt) at a time — official transform on the PIL image, the
    tokenizer at max_length 35, ViT → BERT cross-attention → [CLS] → MLP → (r − mean) / std."""
    from torchvision.transforms import CenterCrop, Compose, InterpolationMode, Normalize, Resize, ToTensor

    state = torch.load(ir_folder / IR_FILE, weights_only=True)
    vit, med = load_blip_modules()
    visual = vit.VisionTransformer(img_size=224, patch_size=32, embed_dim=48, depth=1, num_heads=2)
    visual.load_state_dict({k[len("blip.visual_encoder."):]: v for k, v in state.items()
                            if k.startswith("blip.visual_encoder.")})
    config = med.BertConfig.from_json_file(str(ir_folder / "med_config.json"))
    config.encoder_width = 48
    text = bert_model_class()(config=config, add_pooling_layer=False)
    text.load_state_dict({k[len("blip.text_encoder."):]: v for k, v in state.items()
                          if k.startswith("blip.text_encoder.")})
    weights = [state[f"mlp.layers.{i}.weight"] for i in (0, 2, 4, 6, 7)]
    biases = [state[f"mlp.layers.{i}.bias"] for i in (0, 2, 4, 6, 7)]
    visual.eval()
    text.eval()
    tokenizer = official_tokenizer(ir_folder / "bert-base-uncased")
    transform = Compose([Resize(224, interpolation=InterpolationMode.BICUBIC), CenterCrop(224),
                         lambda image: image.convert("RGB"), ToTensor(), Normalize(CLIP_MEAN, CLIP_STD)])

    def score(images: list[Image.Image], prompts: list[str]) -> torch.Tensor:
        rewards = []
        with torch.no_grad():
            for image, prompt in zip(images, prompts, strict=True):
                tokens = tokenizer(prompt, padding="max_length", truncation=True, max_length=35, return_tensors="pt")
                image_embeds = visual(transform(image).unsqueeze(0))
                output = text(tokens.input_ids, attention_mask=tokens.attention_mask,
                              encoder_hidden_states=image_embeds,
                              encoder_attention_mask=torch.ones(image_embeds.shape[:-1], dtype=torch.long),
                              return_dict=True)
                x = output.last_hidden_state[:, 0, :].float()
                for weight, bias in zip(weights, biases, strict=True):
                    x = x @ weight.T + bias
                rewards.append((x.squeeze() - REWARD_MEAN) / REWARD_STD)
        return torch.stack(rewards)

    score.transform = transform
    score.tokenizer = tokenizer
    return score


def test_imagereward_is_registered_and_declares_its_three_files(ir_folder):
    assert "imagereward" in known_rewards()
    files = ImageRewardScore.required_files(path=ir_folder)
    assert [f.path for f in files] == [ir_folder / IR_FILE, ir_folder / "med_config.json",
                                       ir_folder / "bert-base-uncased" / "vocab.txt"]
    assert "THUDM/ImageReward" in files[0].source and "bert-base-uncased" in files[2].source
    reward = build_reward("imagereward", path=str(ir_folder), device="cpu", vit=TINY_VIT)
    assert reward.name == "imagereward"


@pytest.mark.parametrize("size", [(427, 640), (300, 200), (224, 224), (100, 150)])
def test_imagereward_equals_the_official_score_on_photographs_of_any_size(ir, ir_official, photo, size):
    arrays = [photo] if size == photo.shape[:2] else crops(photo, *size, 3)
    if size == (100, 150):  # smaller than 224: the official Resize enlarges
        arrays = [np.asarray(Image.fromarray(a).resize((150, 100))) for a in crops(photo, 200, 300, 3)]
    prompts = PROMPTS[:len(arrays)]
    scores = ir(as_tensor(arrays), prompts)
    official = ir_official([Image.fromarray(a) for a in arrays], prompts)
    assert relative_gap(scores, official) < 1e-4


def test_imagereward_preprocessing_is_the_official_transform_on_a_photograph(ir, ir_official, photo):
    ours = ir.preprocess(as_tensor([photo]))[0]
    official = ir_official.transform(Image.fromarray(photo))
    assert ours.shape == (3, 224, 224)
    assert torch.equal(ours, official)  # measured difference: exactly 0 (same 8-bit PIL pipeline)
    tokens = ir.tokenize(PROMPTS)
    expected = ir_official.tokenizer(PROMPTS, padding="max_length", truncation=True, max_length=35,
                                     return_tensors="pt")
    assert tokens.input_ids.shape == (len(PROMPTS), 35)
    assert torch.equal(tokens.input_ids, expected.input_ids)
    assert ir.tokenizer.enc_token_id == ir.tokenizer.convert_tokens_to_ids("[ENC]") == len(VOCAB) + 1


def test_imagereward_float_images_are_rounded_to_8_bits_as_the_official_wrappers_do(ir, photo):
    images = as_tensor(crops(photo, 256, 256, 3))
    jitter = (torch.rand_like(images) - 0.5) * 0.9 / 255  # stays within half a grey level
    assert torch.equal(ir(images + jitter, PROMPTS[:3]), ir(images, PROMPTS[:3]))


def test_imagereward_scores_each_image_against_its_own_prompt_once(ir_folder, photo):
    reward = ImageRewardScore(path=ir_folder, device="cpu", batch_size=2, vit=TINY_VIT)
    rows = {"visual": 0, "text": 0}

    def count(name):
        def hook(module, args, kwargs, output):
            rows[name] += output.shape[0] if name == "visual" else output.last_hidden_state.shape[0]
        return hook

    hooks = [reward.net.blip.visual_encoder.register_forward_hook(count("visual"), with_kwargs=True),
             reward.net.blip.text_encoder.register_forward_hook(count("text"), with_kwargs=True)]
    try:
        reward(as_tensor(crops(photo, 240, 240, 5)), PROMPTS[:5])
    finally:
        for hook in hooks:
            hook.remove()
    assert rows == {"visual": 5, "text": 5}  # B, not B² (inference_rank's all-pairs)


def test_imagereward_is_batch_size_invariant_and_not_constant(ir_folder, ir, photo):
    images = as_tensor(crops(photo, 256, 256, 5))
    single = ImageRewardScore(path=ir_folder, device="cpu", batch_size=1, vit=TINY_VIT)
    scores = ir(images, PROMPTS[:5])
    torch.testing.assert_close(single(images, PROMPTS[:5]), scores, atol=1e-6, rtol=1e-5)
    assert scores.std() > 1e-3
    assert ir(images, [PROMPTS[0]] * 5).std() > 1e-3  # images matter
    assert ir(images[:1].expand(5, -1, -1, -1), PROMPTS[:5]).std() > 1e-3  # prompts matter
    details = ir.details(images, PROMPTS[:5])
    torch.testing.assert_close((details["raw"] - REWARD_MEAN) / REWARD_STD, scores)


def test_imagereward_grey_images_score_as_their_rgb_copies(ir, photo):
    grey = as_tensor(crops(photo, 256, 320, 2)).mean(dim=1, keepdim=True)
    assert torch.equal(ir(grey, PROMPTS[:2]), ir(grey.expand(-1, 3, -1, -1), PROMPTS[:2]))


@pytest.mark.parametrize("missing", [IR_FILE, "med_config.json", "bert-base-uncased/vocab.txt"])
def test_imagereward_missing_file_names_it_and_its_source(ir_folder, tmp_path, missing):
    folder = tmp_path / "copy"
    shutil.copytree(ir_folder, folder)
    (folder / missing).unlink()
    with pytest.raises(FileNotFoundError, match=missing.split("/")[-1]) as error:
        ImageRewardScore(path=folder, device="cpu", vit=TINY_VIT)
    source = "google-bert/bert-base-uncased" if "vocab" in missing else "THUDM/ImageReward"
    assert source in str(error.value)


def test_imagereward_safetensors_twin_gives_identical_scores(ir_folder, ir, photo, tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(ir_folder, folder)
    convert_to_safetensors(folder / IR_FILE)
    (folder / IR_FILE).unlink()
    images = as_tensor(crops(photo, 300, 300, 3))
    from_twin = ImageRewardScore(path=folder, device="cpu", vit=TINY_VIT)
    assert torch.equal(from_twin(images, PROMPTS[:3]), ir(images, PROMPTS[:3]))
    assert from_twin.ignored_keys == ir.ignored_keys == sorted(
        ["blip.text_proj.bias", "blip.text_proj.weight", "blip.vision_proj.bias", "blip.vision_proj.weight"])


def test_imagereward_checkpoint_problems_are_named(ir_folder, tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(ir_folder, folder)
    state = torch.load(ir_folder / IR_FILE, weights_only=True)
    torch.save({k: v for k, v in state.items() if k != "mlp.layers.7.weight"}, folder / IR_FILE)
    with pytest.raises(ValueError, match=r"lacks 1 weight.*mlp\.layers\.7\.weight"):
        ImageRewardScore(path=folder, device="cpu", vit=TINY_VIT)
    torch.save({**state, "blip.something_else": torch.zeros(1)}, folder / IR_FILE)
    with pytest.warns(UserWarning, match="blip.something_else"):
        ImageRewardScore(path=folder, device="cpu", vit=TINY_VIT)
    with pytest.raises(ValueError, match="does not fit"):
        ImageRewardScore(path=ir_folder, device="cpu", vit={**TINY_VIT, "width": 64})


def test_imagereward_rejects_bad_options(ir_folder):
    with pytest.raises(ValueError, match="vit must be one of"):
        ImageRewardScore(path=ir_folder, vit="huge")
    with pytest.raises(ValueError, match="vit must be"):
        ImageRewardScore(path=ir_folder, vit={"width": 48})
    with pytest.raises(ValueError, match="batch_size"):
        ImageRewardScore(path=ir_folder, batch_size=0, vit=TINY_VIT)
    with pytest.raises(ValueError, match="needs option `path`"):
        ImageRewardScore.required_files()


def test_blip_compat_leaves_transformers_unchanged_and_refuses_what_it_does_not_support(ir):
    import transformers.modeling_utils

    assert sys.modules["transformers.modeling_utils"] is transformers.modeling_utils
    assert not hasattr(transformers.modeling_utils, "find_pruneable_heads_and_indices")
    _, med = load_blip_modules()
    with pytest.raises(NotImplementedError, match="pruning"):
        med.find_pruneable_heads_and_indices({0}, 2, 16, set())
    with pytest.raises(NotImplementedError, match="head_mask"):
        ir.net.blip.text_encoder.get_head_mask(torch.ones(2), 1)
    encoder = ir.net.blip.text_encoder
    assert encoder.load_state_dict(encoder.state_dict(), strict=True).missing_keys == []


@pytest.mark.parametrize("name", ["hpsv2", "imagereward"])
def test_the_scorer_path_scores_as_in_process(name, hps, ir, photo):
    """imagereward scores 8-bit PIL images, so its images travel as uint8; hpsv2 resizes the float tensors
    (as Sol-RL's scorer), so its travel as float32."""
    images = off_grid(as_tensor(crops(photo, 200, 260, 3)))
    payload = assert_scorer_path_is_exact(hps if name == "hpsv2" else ir, images, PROMPTS[:3])
    assert payload.dtype == (np.float32 if name == "hpsv2" else np.uint8)
