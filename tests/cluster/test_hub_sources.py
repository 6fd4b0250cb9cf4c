"""Hub repo ids in a config, resolved by the preflight from a local cache, offline (tests/hub_cache.py): the
model and the reward folders by id, what a missing repo or file says, the CLI failing before Ray starts.
A job by repo id runs end to end through `ray job submit` in tests/cluster/test_job_submit.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hub_cache import cache_repo, folder_files

from cluster.check import run_checks
from cluster.config.loading import ConfigError, load_config
from cluster.config.preflight import check_inputs
from diffusion.config import EMBEDDED_MODEL
from diffusion.prompts import load_prompt_set
from rewards.digit_classifier import DEFAULT_DIR as CLASSIFIER_DIR

REPO = Path(__file__).resolve().parents[2]
PRESET = "configs/embedded.yaml"


def config_with(*overrides: str):
    return load_config(PRESET, list(overrides))


def error_of(config) -> str:
    with pytest.raises(ConfigError) as info:
        check_inputs(config)
    assert "\n" not in str(info.value)
    return str(info.value)


@pytest.fixture
def cached(hub_cache) -> dict[str, Path]:
    """The embedded model and the committed digit classifier as two repos of the cache (their snapshots), the
    model beside files a pipeline download must leave out."""
    extra = {"embedded.safetensors": b"a single-file checkpoint", "README.md": b"# the embedded model"}
    return {"model": cache_repo(hub_cache, "solrl-test/embedded-digits", {**folder_files(EMBEDDED_MODEL), **extra}),
            "classifier": cache_repo(hub_cache, "solrl-test/digit-classifier", folder_files(CLASSIFIER_DIR))}


def test_the_model_and_a_reward_folder_resolve_by_repo_id_to_their_snapshots(cached):
    given = config_with("model.path=solrl-test/embedded-digits",
                        "reward.options.digit_alignment.path=solrl-test/digit-classifier")
    checked = check_inputs(given)
    assert checked.config.model.path == str(cached["model"].resolve())
    assert checked.config.reward.options["digit_alignment"]["path"] == str(cached["classifier"].resolve())
    assert given.model.path == "solrl-test/embedded-digits"  # the given config is untouched: config.yaml keeps ids
    assert [source.record() for source in checked.sources] == [
        {"field": "reward.options.digit_alignment.path", "repo": "solrl-test/digit-classifier", "type": "model",
         "revision": "main", "commit": cached["classifier"].name, "path": str(cached["classifier"].resolve())},
        {"field": "model.path", "repo": "solrl-test/embedded-digits", "type": "model", "revision": "main",
         "commit": cached["model"].name, "path": str(cached["model"].resolve())}]
    assert checked.sources[0].fetch == ("hf download solrl-test/digit-classifier --include config.json "
                                        "--include model.safetensors")
    # everything else of the config is as given
    assert checked.config.model_dump(exclude={"model": {"path"}, "reward": {"options"}}) == \
        given.model_dump(exclude={"model": {"path"}, "reward": {"options"}})


def test_every_preflight_row_is_evaluated_on_a_model_given_by_repo_id(cached):
    rows = run_checks(config_with("model.path=solrl-test/embedded-digits"))
    assert [(row.check, row.ok, row.evaluated) for row in rows if row.check != "backend"] == [
        ("inputs", True, True), ("resources", True, True), ("learners", True, True), ("plan", True, True),
        ("memory", True, True), ("shm", True, True)]


def test_a_missing_model_repo_names_the_download_command(hub_cache):
    message = error_of(config_with("model.path=stabilityai/stable-diffusion-3.5-large"))
    assert re.fullmatch(
        r"model\.path: stabilityai/stable-diffusion-3\.5-large is not in the Hugging Face cache \(\S+\) and "
        r"HF_HUB_OFFLINE=1 forbids downloading; fetch it where the hub is reachable with `hf download "
        r"stabilityai/stable-diffusion-3\.5-large --include model_index\.json --include 'transformer/\*\.json' .*"
        r"--exclude 'tokenizer_3/\*\.msgpack\.index\.json'` \(if the repo is gated, accept its licence at "
        r"https://huggingface\.co/stabilityai/stable-diffusion-3\.5-large first\)", message), message


def test_a_reward_repo_is_fetched_with_exactly_the_files_the_reward_loads(hub_cache):
    pick = ("reward.weights={pickscore: 1.0}", "reward.options.pickscore.path=yuvalkirstain/PickScore_v1")
    laion = "reward.options.pickscore.processor_path=laion/CLIP-ViT-H-14-laion2B-s32B-b79K"
    message = error_of(config_with(*pick, laion))
    assert message.startswith("reward.options.pickscore.path: yuvalkirstain/PickScore_v1 is not in the Hugging Face "
                              "cache")
    assert "`hf download yuvalkirstain/PickScore_v1 --include config.json --include model.safetensors`" in message
    # without a processor folder, PickScore reads the processor from path/processor: those files come too
    message = error_of(config_with(*pick))
    assert ("`hf download yuvalkirstain/PickScore_v1 --include config.json --include model.safetensors --include "
            "processor/merges.txt --include processor/preprocessor_config.json --include "
            "processor/tokenizer_config.json --include processor/vocab.json`") in message


def test_a_file_missing_from_a_cached_reward_repo_names_the_file_and_the_command(hub_cache):
    cache_repo(hub_cache, "solrl-test/hps", {"README.md": b"no checkpoint here"})
    message = error_of(config_with("reward.weights={hpsv2: 1.0}", "reward.options.hpsv2.path=solrl-test/hps"))
    assert re.fullmatch(r"reward\.options\.hpsv2: missing \S+/models--solrl-test--hps/snapshots/[0-9a-f]{40}/"
                        r"HPS_v2\.1_compressed\.pt \(from huggingface\.co/xswu/HPSv2 \(HPSv2\.1 of tgxs002/HPSv2\)\); "
                        r"fetch it with `hf download solrl-test/hps --include HPS_v2\.1_compressed\.pt`", message), \
        message


def test_an_option_naming_a_single_file_refuses_a_repo_id(hub_cache, tmp_path):
    signs = tmp_path / "signs.txt"
    signs.write_text('a shop sign that says "open"\na poster that reads "hello"\n')
    message = error_of(config_with("reward.weights={ocr: 1.0}", f"prompts.source={signs}",
                                   f"prompts.eval_source={signs}", "reward.options.ocr.det_model_path=org/ppocr"))
    assert message == ("reward.options.ocr.det_model_path: org/ppocr is a repo id, but det_model_path names a single "
                       "file; download it (`hf download org/ppocr FILE`) and give the file's path")


def test_the_launcher_fails_in_one_line_before_ray_starts_on_a_missing_repo(hub_cache, tmp_path):
    run_dir = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "cluster.launch", "--config", PRESET, "--run-dir", str(run_dir),
                             "--set", "model.path=org/not-cached"], cwd=REPO, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: model.path: org/not-cached is not in the Hugging Face "
                                                   f"cache ({hub_cache}) and HF_HUB_OFFLINE=1 forbids downloading; "
                                                   "fetch it where the hub is reachable with `hf download "
                                                   "org/not-cached --include model_index.json"), result.stderr
    assert not run_dir.exists() and "Ray" not in result.stdout


def test_the_run_records_the_ids_it_was_given_and_the_commits_they_resolved_to(cached, tmp_path):
    from cluster import launch

    given = config_with("model.path=solrl-test/embedded-digits")
    checked = check_inputs(given)
    args = launch.argparse.Namespace(resume=None, checkpoint="latest", config=PRESET, set=["model.path=…"])
    launch.record_launch(tmp_path, given, args, 0, None, checked.sources)
    assert load_config(tmp_path / "config.yaml").model.path == "solrl-test/embedded-digits"
    line = json.loads((tmp_path / "launches.jsonl").read_text())
    assert line["hub_sources"] == [{"field": "model.path", "repo": "solrl-test/embedded-digits", "type": "model",
                                    "revision": "main", "commit": cached["model"].name,
                                    "path": str(cached["model"].resolve())}]


def test_a_prompt_file_on_the_hub_resolves_from_the_cache_with_its_metadata(hub_cache):
    lines = [{"tag": "single_object", "include": [{"class": "bench", "count": 1}], "prompt": "a photo of a bench"},
             {"tag": "counting", "include": [{"class": "cat", "count": 2}], "prompt": "a photo of two cats"}]
    jsonl = "".join(json.dumps(line) + "\n" for line in lines).encode()
    snapshot = cache_repo(hub_cache, "solrl-test/prompts", {"geneval/test_metadata.jsonl": jsonl}, kind="dataset")
    address = "hf://datasets/solrl-test/prompts/geneval/test_metadata.jsonl"
    checked = check_inputs(config_with(f"prompts.source={address}", f"prompts.eval_source={address}",
                                       "reward.weights={jpeg_compressibility: 1.0}"))
    assert checked.config.prompts.source == str(snapshot.resolve() / "geneval" / "test_metadata.jsonl")
    assert [(s.field, s.ref.kind, s.file) for s in checked.sources[:2]] == [
        ("prompts.source", "dataset", "geneval/test_metadata.jsonl"),
        ("prompts.eval_source", "dataset", "geneval/test_metadata.jsonl")]
    loaded = load_prompt_set(checked.config.prompts.source)
    assert loaded.metadata_of("a photo of two cats") == [{"tag": "counting", "include": [{"class": "cat", "count": 2}]}]
    missing = error_of(config_with("prompts.source=hf://datasets/solrl-test/prompts@v2/geneval/train_metadata.jsonl"))
    assert missing.startswith("prompts.source: hf://datasets/solrl-test/prompts@v2 is not in the Hugging Face cache")
    assert ("`hf download solrl-test/prompts --repo-type dataset --revision v2 --include "
            "geneval/train_metadata.jsonl`") in missing
