"""Hub ids: which values name a repo, which files a pipeline download takes, and offline resolution from a cache
laid out as huggingface_hub writes it (tests/hub_cache.py)."""

from __future__ import annotations

import json
import shlex

import pytest
from hub_cache import cache_repo, folder_files
from huggingface_hub.utils import filter_repo_objects

from diffusion.hub import HubRef, HubUnavailable, download_command, hub_ref, pipeline_snapshot, snapshot
from diffusion.loading import check_model_folder, load_policy, pipeline_patterns

# The files of stabilityai/stable-diffusion-3.5-large's main branch (its file list on the hub), less a few of the
# same kind: the diffusers folders beside ComfyUI single-file checkpoints, example images and a workflow.
SD35_LARGE_FILES = [
    ".gitattributes", "LICENSE.md", "README.md", "SD3.5L_example_workflow.json", "mmdit.png", "sd3.5_large.safetensors",
    "sd3.5_large_demo.png", "model_index.json", "scheduler/scheduler_config.json",
    "text_encoder/config.json", "text_encoder/model.safetensors", "text_encoder_2/config.json",
    "text_encoder_2/model.safetensors", "text_encoder_3/config.json", "text_encoder_3/model-00001-of-00002.safetensors",
    "text_encoder_3/model-00002-of-00002.safetensors", "text_encoder_3/model.safetensors.index.json",
    "text_encoders/README.md", "text_encoders/clip_g.safetensors", "text_encoders/clip_l.safetensors",
    "text_encoders/t5xxl_fp16.safetensors", "text_encoders/t5xxl_fp8_e4m3fn.safetensors",
    "tokenizer/merges.txt", "tokenizer/special_tokens_map.json", "tokenizer/tokenizer_config.json",
    "tokenizer/vocab.json", "tokenizer_2/merges.txt", "tokenizer_2/special_tokens_map.json",
    "tokenizer_2/tokenizer_config.json", "tokenizer_2/vocab.json", "tokenizer_3/special_tokens_map.json",
    "tokenizer_3/spiece.model", "tokenizer_3/tokenizer.json", "tokenizer_3/tokenizer_config.json",
    "transformer/config.json", "transformer/diffusion_pytorch_model-00001-of-00002.safetensors",
    "transformer/diffusion_pytorch_model-00002-of-00002.safetensors",
    "transformer/diffusion_pytorch_model.safetensors.index.json", "vae/config.json",
    "vae/diffusion_pytorch_model.safetensors",
    # what other repos add, none of which this loader reads: variants, pickles, flax
    "vae/diffusion_pytorch_model.fp16.safetensors", "text_encoder_3/model.fp16-00001-of-00002.safetensors",
    "text_encoder_3/model.safetensors.index.fp16.json", "text_encoder/pytorch_model.bin",
    "text_encoder/pytorch_model.bin.index.json", "vae/diffusion_flax_model.msgpack",
]
SD35_COMPONENTS = ["scheduler", "text_encoder", "text_encoder_2", "text_encoder_3", "tokenizer", "tokenizer_2",
                   "tokenizer_3", "transformer", "vae"]


@pytest.mark.parametrize(("value", "expected"), [
    ("stabilityai/stable-diffusion-3.5-large", HubRef("stabilityai/stable-diffusion-3.5-large")),
    ("black-forest-labs/FLUX.1-dev@main", HubRef("black-forest-labs/FLUX.1-dev", "main")),
    ("org/name@0123456789abcdef0123456789abcdef01234567", HubRef("org/name", "0123456789abcdef" * 2 + "01234567")),
    ("org/name@refs/pr/1", HubRef("org/name", "refs/pr/1")),
    ("/models/sd35", None), ("./models/sd35", None), ("~/models/sd35", None), ("models/sd35/large", None),
    ("embedded", None), ("org/../name", None), ("org/name@", None), ("", None),
])
def test_a_value_names_a_repo_only_when_shaped_as_one(value, expected):
    assert hub_ref(value) == expected


def test_an_existing_relative_folder_is_never_a_repo(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "sd35").mkdir(parents=True)
    assert hub_ref("models/sd35") is None
    assert hub_ref("models/sd36") == HubRef("models/sd36")  # not here: it reads as a repo id


def test_a_pipeline_download_takes_exactly_the_files_the_loader_reads():
    include, exclude = pipeline_patterns(SD35_COMPONENTS)
    taken = sorted(filter_repo_objects(SD35_LARGE_FILES, allow_patterns=include, ignore_patterns=exclude))
    expected = sorted(
        name for name in SD35_LARGE_FILES
        if name == "model_index.json"
        or (name.split("/")[0] in SD35_COMPONENTS and name.count("/") == 1
            and name.rsplit(".", 1)[-1] in ("json", "txt", "model", "safetensors")
            and not any(v in name for v in (".fp16", ".bin", ".msgpack"))))
    assert taken == expected
    assert "sd3.5_large.safetensors" not in taken and not any(name.startswith("text_encoders/") for name in taken)
    assert "text_encoder_3/model.safetensors.index.json" in taken and "tokenizer_3/spiece.model" in taken


def test_the_download_command_names_every_pattern_quoted_for_a_shell():
    command = download_command(HubRef("org/name", "v1"), ["model_index.json", "transformer/*.json"],
                               ["*.*.safetensors"])
    assert shlex.split(command) == ["hf", "download", "org/name", "--revision", "v1", "--include", "model_index.json",
                                    "--include", "transformer/*.json", "--exclude", "*.*.safetensors"]


def test_a_cached_pipeline_resolves_offline_to_its_snapshot_and_loads(hub_cache, tiny_folder):
    folder = tiny_folder("sd3")
    extra = {"sd3_tiny.safetensors": b"single-file checkpoint", "README.md": b"# tiny"}
    snapshot_folder = cache_repo(hub_cache, "solrl-test/tiny-sd3", {**folder_files(folder), **extra})
    resolved, fetch = pipeline_snapshot(HubRef("solrl-test/tiny-sd3"))
    assert resolved == snapshot_folder.resolve()
    check_model_folder(resolved)
    policy = load_policy(resolved)
    assert type(policy.transformer).__name__ == "SD3Transformer2DModel"
    components = [c for c, spec in json.loads((folder / "model_index.json").read_text()).items()
                  if not c.startswith("_") and spec[0] is not None]
    include, exclude = pipeline_patterns(components)
    assert fetch == download_command(HubRef("solrl-test/tiny-sd3"), [*include, "README.md"], exclude)
    # a revision pinned by its commit resolves to the same folder
    assert pipeline_snapshot(HubRef("solrl-test/tiny-sd3", resolved.name))[0] == resolved


def test_a_repo_missing_from_the_cache_offline_is_one_line_with_the_download_command(hub_cache):
    with pytest.raises(HubUnavailable) as raised:
        pipeline_snapshot(HubRef("stabilityai/stable-diffusion-3.5-large"))
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"stabilityai/stable-diffusion-3.5-large is not in the Hugging Face cache ({hub_cache}) "
                              "and HF_HUB_OFFLINE=1 forbids downloading; fetch it where the hub is reachable with "
                              "`hf download stabilityai/stable-diffusion-3.5-large --include model_index.json "
                              "--include 'transformer/*.json'")
    assert message.endswith("(if the repo is gated, accept its licence at "
                            "https://huggingface.co/stabilityai/stable-diffusion-3.5-large first)")


def test_a_revision_not_in_the_cache_is_missing_too(hub_cache):
    cache_repo(hub_cache, "solrl-test/files", {"a.json": b"{}"})
    assert (snapshot(HubRef("solrl-test/files"), ["a.json"]) / "a.json").read_bytes() == b"{}"
    with pytest.raises(HubUnavailable, match=r"^solrl-test/files@v2 is not in the Hugging Face cache .*"
                                             r"`hf download solrl-test/files --revision v2 --include a\.json`"):
        snapshot(HubRef("solrl-test/files", "v2"), ["a.json"])
