"""The embedded model's architecture: a tiny SD3-family text-to-image model, saved like any real one.

- tokenizer: a word-level tokenizer built in memory from the world's prompt vocabulary (no hub),
  saved as `tokenizer.json`, loaded back by `PreTrainedTokenizerFast` like any fast tokenizer;
- text encoder: a 3-layer `CLIPTextModelWithProjection` (width 32);
- transformer: a 4-block `SD3Transformer2DModel` (width 64, 2×2 patches of 16×16×1 pixel latents);
- no VAE: the model works in pixel space (x = 2·image − 1), so decoding is (x + 1) / 2.
The folder has the layout of a diffusers SD3 pipeline (model_index.json and one folder per
component) and is read by `diffusion.loading.load_policy` exactly like SD3.5-Large. diffusers' own
`StableDiffusion3Pipeline` cannot load it (it needs two CLIP encoders and a VAE): `write_diffusers_pipeline`
makes such a folder (an export, `cluster.export`) one that `DiffusionPipeline.from_pretrained(folder,
trust_remote_code=True)` loads and samples, with its own pipeline class (`diffusion/embedded/pipeline.py`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import CLIPTextConfig, CLIPTextModelWithProjection, PreTrainedTokenizerFast

from diffusion.embedded.data import DIGIT_WORDS, HELDOUT_TEMPLATES, IMAGE_SIZE, TRAIN_TEMPLATES

SPECIAL_TOKENS = ("<pad>", "<unk>", "<bos>", "<eos>")
MAX_TOKENS = 12  # the longest prompt is 8 words + <bos> + <eos>
TEXT_WIDTH = 32
SHIFT = 1.0  # tiny 16×16 images need no resolution shift
PIPELINE_SOURCE = Path(__file__).with_name("pipeline.py")
PIPELINE_MODULE, PIPELINE_CLASS = "pipeline", "EmbeddedDigitsPipeline"  # <folder>/pipeline.py, its class


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Word-level tokenizer over the words of every template and digit, lower-cased."""
    words = {w for t in TRAIN_TEMPLATES + HELDOUT_TEMPLATES for w in t.replace(",", " ").split() if "{" not in w}
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + tuple(sorted(words | set(DIGIT_WORDS))))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace()])
    core.post_processor = processors.TemplateProcessing(
        single="<bos> $A <eos>", special_tokens=[("<bos>", vocab["<bos>"]), ("<eos>", vocab["<eos>"])]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        model_max_length=MAX_TOKENS,
    )
    if len(tokenizer) != len(vocab):
        raise AssertionError(f"tokenizer has {len(tokenizer)} tokens, expected {len(vocab)}")
    return tokenizer


def build_text_encoder(tokenizer: PreTrainedTokenizerFast) -> CLIPTextModelWithProjection:
    config = CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=TEXT_WIDTH,
        intermediate_size=2 * TEXT_WIDTH,
        projection_dim=TEXT_WIDTH,
        num_hidden_layers=3,
        num_attention_heads=2,
        max_position_embeddings=MAX_TOKENS,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,  # the pooled output is taken at the first <eos>
    )
    return CLIPTextModelWithProjection(config)


def build_transformer() -> SD3Transformer2DModel:
    return SD3Transformer2DModel(
        sample_size=IMAGE_SIZE,
        patch_size=2,
        in_channels=1,
        out_channels=1,
        num_layers=4,
        attention_head_dim=16,
        num_attention_heads=4,
        joint_attention_dim=TEXT_WIDTH,
        caption_projection_dim=64,
        pooled_projection_dim=TEXT_WIDTH,
        pos_embed_max_size=IMAGE_SIZE // 2,
    )


def save_model_folder(
    folder: Path,
    transformer: SD3Transformer2DModel,
    text_encoder: CLIPTextModelWithProjection,
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    """Write a diffusers-format folder (safetensors weights, JSON configs)."""
    folder.mkdir(parents=True, exist_ok=True)
    transformer.save_pretrained(folder / "transformer", safe_serialization=True)
    text_encoder.save_pretrained(folder / "text_encoder", safe_serialization=True)
    tokenizer.save_pretrained(folder / "tokenizer")
    FlowMatchEulerDiscreteScheduler(shift=SHIFT).save_pretrained(folder / "scheduler")
    index = {
        "_class_name": "StableDiffusion3Pipeline",
        "_diffusers_version": __import__("diffusers").__version__,
        "transformer": ["diffusers", "SD3Transformer2DModel"],
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "CLIPTextModelWithProjection"],
        "tokenizer": ["transformers", "PreTrainedTokenizerFast"],
        "text_encoder_2": [None, None],
        "tokenizer_2": [None, None],
        "text_encoder_3": [None, None],
        "tokenizer_3": [None, None],
        "vae": [None, None],
    }
    (folder / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")


def _present(index: dict, name: str) -> bool:
    spec = index.get(name)
    return isinstance(spec, list) and bool(spec) and spec[0] is not None


def has_embedded_layout(index: dict) -> bool:
    """Whether a model_index.json describes this model's layout: an SD3 folder with one text encoder and
    no VAE, which `StableDiffusion3Pipeline.from_pretrained` refuses."""
    return (index.get("_class_name") == "StableDiffusion3Pipeline" and _present(index, "text_encoder")
            and not _present(index, "text_encoder_2") and not _present(index, "vae"))


def write_diffusers_pipeline(folder: Path) -> None:
    """Make an embedded-layout folder a diffusers pipeline of its own class: `pipeline.py` beside the
    components, and a model_index.json that names it (diffusers' convention for a pipeline that ships its
    code) and lists only the components it has."""
    index_file = folder / "model_index.json"
    index = json.loads(index_file.read_text())
    if not has_embedded_layout(index):
        raise ValueError(f"{index_file} does not describe the embedded model's layout (an SD3 folder with one "
                         "text encoder and no VAE)")
    shutil.copyfile(PIPELINE_SOURCE, folder / f"{PIPELINE_MODULE}.py")
    components = {k: v for k, v in index.items() if not k.startswith("_") and _present(index, k)}
    version = index.get("_diffusers_version", __import__("diffusers").__version__)
    rewritten = {"_class_name": [PIPELINE_MODULE, PIPELINE_CLASS], "_diffusers_version": version, **components}
    index_file.write_text(json.dumps(rewritten, indent=2) + "\n")
