"""Checks of files, folders and cross-field rules before Ray starts: one line per user error, no traceback.

Model folders are copies of the committed embedded model, broken on purpose; the CLI tests run the real
`python -m cluster.launch` and must fail before any run directory exists.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from cluster.config.loading import ConfigError, load_config
from cluster.config.preflight import check_inputs
from diffusion.config import EMBEDDED_MODEL
from diffusion.loading import check_model_folder, check_safetensors
from diffusion.prompts import load_prompts
from rewards.digit_classifier import DEFAULT_DIR as CLASSIFIER_DIR
from rewards.geneval import register_detector

REPO = Path(__file__).resolve().parents[2]
PRESET = "configs/embedded.yaml"
TRANSFORMER_WEIGHTS = Path("transformer") / "diffusion_pytorch_model.safetensors"


def config_with(*overrides: str):
    return load_config(PRESET, list(overrides))


def fails(config, message: str) -> str:
    """check_inputs raises a one-line ConfigError matching `message` (a regex, matched in full)."""
    with pytest.raises(ConfigError) as info:
        check_inputs(config)
    text = str(info.value)
    assert "\n" not in text
    assert re.fullmatch(message, text), text
    return text


@pytest.fixture
def model(tmp_path) -> Path:
    """A private copy of the committed embedded model folder, to break."""
    return Path(shutil.copytree(EMBEDDED_MODEL, tmp_path / "model"))


def edit_json(file: Path, **changes) -> None:
    data = json.loads(file.read_text())
    data.update(changes)
    file.write_text(json.dumps(data))


# ---- prompt files ----------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["prompts.source", "prompts.eval_source"])
@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, r"prompt file \S+ does not exist \(use 'embedded', a text, \.jsonl or \.csv file, a flow_grpo-layout "
               r"folder, or hf://datasets/org/name/file\)"),
        ("DIR", r"prompt folder \S+ has no (train_metadata\.jsonl or train\.txt|test_metadata\.jsonl or test\.txt) "
                r"\(flow_grpo's layout: the (training|held-out) split\); name a file instead"),
        (b"", r"prompt file \S+ holds no prompts \(it is empty or only whitespace\); write one per line"),
        (b"  \n\t\n \n", r"prompt file \S+ holds no prompts \(it is empty or only whitespace\); write one per line"),
        (b"a digit one\n\xff\xfe two\n",
         r"prompt file \S+ is not UTF-8 text \(byte 0xff at line 2\); save it as UTF-8"),
    ],
    ids=["missing", "directory", "empty", "whitespace", "latin1"],
)
def test_bad_prompt_files_are_named_with_their_field(tmp_path, field, content, message):
    path = tmp_path / "prompts.txt"
    if content == "DIR":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    fails(config_with(f"{field}={path}"), rf"{re.escape(field)}: {message}")


def test_a_good_prompt_file_passes_and_loses_its_byte_order_mark(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_bytes("\ufeffa digit one\n\n  a digit two  \n".encode())
    assert check_inputs(config_with(f"prompts.source={path}", f"prompts.eval_source={path}")).notes == []
    assert load_prompts(str(path)) == ["a digit one", "a digit two"]


DIGITS = "zero, one, two, three, four, five, six, seven, eight, nine"


@pytest.mark.parametrize(("field", "source", "first"), [
    ("prompts.source", "configs/prompts/train.txt", "a red fox sitting in fresh snow at sunrise"),
    ("prompts.eval_source", "configs/prompts/heldout.txt", "a fox and a rabbit sharing a picnic blanket"),
])
def test_prompts_the_reward_cannot_score_are_refused_before_anything_starts(field, source, first):
    """Before: these passed the preflight and the job died once Ray had started, inside an explorer."""
    fails(config_with(f"{field}={source}"), re.escape(
        f"{field}: the digit_alignment reward cannot score the prompts of '{source}': prompt 0: prompt '{first}' "
        f"must name exactly one digit in words ({DIGITS}); found none (the embedded prompt sets, 'embedded', name "
        f"one each); give {field} a prompt set it can score, or choose another reward (reward.weights)"))


NO_FILES_DETECTOR = "preflight_no_files"


@register_detector(NO_FILES_DETECTOR)
class NoFilesDetector:
    """A detector with no weight files: the preflight only looks it up (it is never called here)."""

    @classmethod
    def required_files(cls, **options) -> list:
        return []


def test_every_configured_reward_checks_the_prompts_it_will_be_handed(tmp_path):
    quoted = tmp_path / "ocr.txt"
    quoted.write_text('a sign that says "one"\na handwritten digit two\n', encoding="utf-8")
    fails(config_with(f"prompts.source={quoted}", "reward.weights={digit_margin: 1.0, ocr: 1.0}"), re.escape(
        f"prompts.source: the ocr reward cannot score the prompts of '{quoted}': prompt 1: the ocr reward needs the "
        "target text in double quotes in the prompt, got 'a handwritten digit two'; give prompts.source a prompt "
        "set it can score, or choose another reward (reward.weights)"))
    # a reward that cannot be built (geneval without a detector) is named first, whatever its prompts
    fails(config_with("reward.weights={geneval: 1.0}", "prompts.source=configs/prompts/train.txt"),
          r"reward\.options\.geneval: the geneval reward needs an object detector, .*")
    # with one, geneval reads each prompt's metadata: a text file has none, a GenEval .jsonl passes
    detector = ["reward.weights={geneval: 1.0}", f"reward.options.geneval.detector={NO_FILES_DETECTOR}"]
    fails(config_with(*detector, "prompts.source=configs/prompts/train.txt"),
          r"prompts\.source: the geneval reward cannot score the prompts of 'configs/prompts/train\.txt': prompt 0: "
          r"GenEval metadata needs a 'tag' .*, got \{\}; use a GenEval \.jsonl prompt set .*")
    jsonl = tmp_path / "geneval.jsonl"
    jsonl.write_text(json.dumps({"prompt": "a photo of two cats", "tag": "counting",
                                 "include": [{"class": "cat", "count": 2}]}) + "\n", encoding="utf-8")
    check_inputs(config_with(*detector, f"prompts.source={jsonl}", f"prompts.eval_source={jsonl}"))


# ---- the weight-sync region in /dev/shm ------------------------------------------------------------


@pytest.fixture(scope="module")
def embedded_meta():
    from cluster.check import meta_transformer
    from diffusion.families import family_for_transformer

    model = meta_transformer(EMBEDDED_MODEL)
    return model, family_for_transformer(type(model).__name__)


@pytest.mark.parametrize("codec", ["nvfp4", "dense", "lora"])
def test_the_snapshot_estimate_is_the_slot_the_learner_writes(codec, embedded_meta, embedded_policy):
    """The preflight sizes the region from the meta-device model alone; the learner's real snapshot of the
    embedded model (θ_old as published, encoded by the codec) takes exactly that many bytes in a slot."""
    from cluster.check import snapshot_estimate
    from diffusion.explore import explore_plan
    from learner.config import TrainingConfig
    from learner.training_state import TrainingState
    from weight_sync.codecs import encode, payload_bytes
    from weight_sync.shm import slot_bytes

    config = config_with(f"cluster.codec={codec}")
    if codec == "lora":
        state = TrainingState(copy.deepcopy(embedded_policy.transformer), TrainingConfig(lora_rank=32, lora_alpha=64),
                              family_targets=embedded_policy.family.lora_targets)
        weights, quantize, meta = state.old_parameters(), (), {"lora_scale": 2.0}
    else:
        weights = embedded_policy.transformer.state_dict()
        quantize, meta = explore_plan(embedded_policy, config.explore).quantized_weights, {}
    arrays, manifest = encode(weights, codec, version=7, quantize=quantize, meta=meta)
    written = slot_bytes(payload_bytes(arrays), len(arrays), len(json.dumps(manifest.to_json())))
    assert snapshot_estimate(config, *embedded_meta) == (codec, written)


def test_too_little_room_in_dev_shm_is_a_warning_naming_it_and_the_sizes(embedded_meta):
    from cluster.check import shm_row, snapshot_estimate
    from weight_sync.shm import region_bytes, shm_free_bytes, size_text

    config = config_with()
    codec, nbytes = snapshot_estimate(config, *embedded_meta)
    assert codec == "nvfp4"  # auto, for the embedded NVFP4 engine
    need = region_bytes(nbytes)
    row = shm_row(config, *embedded_meta, free=need)
    assert row.ok is True and row.detail.startswith(f"weight-sync region {size_text(need)} (2 slots for nvfp4 ")
    row = shm_row(config, *embedded_meta, free=need - 1)
    assert row.ok is None  # a warning: the service falls back to the object store
    assert row.detail == (f"/dev/shm has {size_text(need - 1)} free, the weight-sync region needs {size_text(need)} "
                          f"(2 slots for snapshots of {size_text(nbytes)}): snapshots go through Ray's object store "
                          "instead (slower); to use shared memory give /dev/shm 1 B more room (docker run "
                          "--shm-size=1g or more; else mount -o remount,size=<larger> /dev/shm)")
    free = shm_free_bytes()
    assert free is not None and free > need  # this machine's real /dev/shm (statvfs) holds the embedded region
    row = shm_row(config, *embedded_meta)
    assert row.ok is True and re.fullmatch(r"weight-sync region .*; /dev/shm has [\d.]+ [KMG]iB free", row.detail)


# ---- model folders ---------------------------------------------------------------------------------


def test_an_intact_model_folder_passes(model):
    check_model_folder(model)
    assert check_inputs(config_with(f"model.path={model}")).notes == []


def _truncate(model: Path, size: int) -> None:
    file = model / TRANSFORMER_WEIGHTS
    file.write_bytes(file.read_bytes()[:size])


def _corrupt_header(model: Path) -> None:
    file = model / TRANSFORMER_WEIGHTS
    data = bytearray(file.read_bytes())
    data[8:20] = b"\xff" * 12
    file.write_bytes(bytes(data))


def _append(model: Path) -> None:
    with (model / TRANSFORMER_WEIGHTS).open("ab") as handle:
        handle.write(b"\0" * 16)


BROKEN_MODELS = {
    "missing": (lambda m: shutil.rmtree(m), r"\S+/model does not exist; a model folder is what diffusers' "
                r"save_pretrained writes \(model_index\.json, transformer/, text_encoder/, tokenizer/, scheduler/, "
                r"optional vae/\)"),
    "a file": (lambda m: (shutil.rmtree(m), m.write_text("x")), r"\S+/model is a file, not a folder; a model .*"),
    "empty": (lambda m: (shutil.rmtree(m), m.mkdir()), r"\S+/model is empty; a model folder is what .*"),
    "no index": (lambda m: (m / "model_index.json").unlink(),
                 r"\S+/model_index\.json is missing: it names the folder's components; a model folder is .*"),
    "index not JSON": (lambda m: (m / "model_index.json").write_text('{"transformer": ["diffusers", '),
                       r"\S+/model_index\.json is not valid JSON \(Expecting value: line 1 column 31 \(char 30\)\); "
                       r"it names the folder's components; .*"),
    "component missing": (lambda m: shutil.rmtree(m / "text_encoder"),
                          r"\S+/model/text_encoder is missing: component 'text_encoder' is listed in "
                          r"\S+/model_index\.json; restore the folder or set its entry to \[null, null\]"),
    "component empty": (lambda m: [f.unlink() for f in (m / "tokenizer").iterdir()],
                        r"\S+/model/tokenizer is empty: component 'tokenizer' is listed in \S+/model_index\.json"),
    "unknown class": (lambda m: edit_json(m / "model_index.json",
                                          text_encoder=["transformers", "CLIPTextModelWithProjektion"]),
                      r"\S+/model_index\.json: transformers has no class 'CLIPTextModelWithProjektion' \(component "
                      r"'text_encoder'\); check the spelling, or the installed version of the library"),
    "unknown scheduler class": (lambda m: edit_json(m / "model_index.json",
                                                    scheduler=["diffusers", "FlowMatchEulerScheduler"]),
                                r"\S+/model_index\.json: diffusers has no class 'FlowMatchEulerScheduler' .*"),
    "unknown library": (lambda m: edit_json(m / "model_index.json", text_encoder=["open_clip", "CLIP"]),
                        r"\S+/model_index\.json: component 'text_encoder' comes from 'open_clip', which is not "
                        r"loadable here; expected one of diffusers, transformers"),
    "unknown transformer class": (lambda m: edit_json(m / "model_index.json",
                                                      transformer=["diffusers", "SD4Transformer2DModel"]),
                                  r"\S+/model_index\.json: no model family for transformer class "
                                  r"'SD4Transformer2DModel'; known: SD3Transformer2DModel \(sd3\), .*"),
    "transformer classes disagree": (
        lambda m: edit_json(m / "transformer" / "config.json", _class_name="FluxTransformer2DModel"),
        r"\S+/transformer/config\.json names FluxTransformer2DModel but \S+/model_index\.json names "
        r"SD3Transformer2DModel; the folder mixes two models: restore one of them"),
    "transformer config not JSON": (lambda m: (m / "transformer" / "config.json").write_text("{"),
                                    r"\S+/transformer/config\.json is not valid JSON \(.*\); the transformer's config"),
    "pickle only": (lambda m: (m / TRANSFORMER_WEIGHTS).rename(m / "transformer" / "diffusion_pytorch_model.bin"),
                    r"\S+/model/transformer has no \*\.safetensors weights \(only safetensors are loaded, never "
                    r"pickle files\); convert them with save_pretrained\(safe_serialization=True\)"),
    "truncated data": (lambda m: _truncate(m, 1_000_000),
                       r"\S+/diffusion_pytorch_model\.safetensors is truncated: its header places tensor data up to "
                       r"byte \d+ but the file holds \d+ bytes of data; copy or download it again"),
    "truncated header": (lambda m: _truncate(m, 100),
                         r"\S+/diffusion_pytorch_model\.safetensors is truncated or not a safetensors file: its header "
                         r"length \(\d+ bytes\) exceeds the file \(100 bytes\); copy or download it again"),
    "shorter than a header": (lambda m: _truncate(m, 5),
                              r"\S+\.safetensors is not a safetensors file \(5 bytes, not even the header "
                              r"length\); .*"),
    "corrupt header": (_corrupt_header,
                       r"\S+/diffusion_pytorch_model\.safetensors has a corrupt safetensors header \(.*\); "
                       r"copy or download it again"),
    "trailing bytes": (_append, r"\S+\.safetensors is corrupt: it holds \d+ bytes of tensor data but its header "
                       r"accounts for \d+; copy or download it again"),
}


@pytest.mark.parametrize("case", list(BROKEN_MODELS))
def test_a_broken_model_folder_fails_in_one_line_naming_the_file(model, case):
    breaks, message = BROKEN_MODELS[case]
    breaks(model)
    with pytest.raises((OSError, ValueError, NotImplementedError)):
        check_model_folder(model)
    fails(config_with(f"model.path={model}"), rf"model\.path: {message}")


def test_a_safetensors_header_with_offsets_that_do_not_fit_the_shape_is_corrupt(tmp_path):
    header = json.dumps({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}}).encode()
    file = tmp_path / "w.safetensors"
    file.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 12)
    with pytest.raises(ValueError, match=r"corrupt safetensors header \(tensor 'w' has offsets \[0, 12\] that do "
                                         r"not fit its dtype and shape\)"):
        check_safetensors(file)


def test_checking_a_model_folder_reads_no_weights(model, monkeypatch):
    """A real model is many GB: only the header of each safetensors file may be read."""
    read: list[int] = []
    original = Path.open

    def counting_open(self, mode="r", *args, **kwargs):
        handle = original(self, mode, *args, **kwargs)
        if self.suffix == ".safetensors":
            raw_read = handle.read
            handle = _Counting(handle, raw_read, read)
        return handle

    monkeypatch.setattr(Path, "open", counting_open)
    check_model_folder(model)
    size = (model / TRANSFORMER_WEIGHTS).stat().st_size
    assert read and sum(read) < size // 10


class _Counting:
    def __init__(self, handle, raw_read, log: list[int]) -> None:
        self._handle, self._raw_read, self._log = handle, raw_read, log

    def read(self, n: int = -1) -> bytes:
        data = self._raw_read(n)
        self._log.append(len(data))
        return data

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._handle.close()


# ---- reward files ----------------------------------------------------------------------------------


def test_reward_classifier_folder_is_checked(tmp_path):
    field = r"reward\.options\.digit_alignment\.path"
    fails(config_with(f"reward.options.digit_alignment.path={tmp_path / 'nope'}"),
          rf"{field}: \S+/nope does not exist; name the folder holding config\.json and model\.safetensors \(null: "
          r"the committed classifier\), or build one with `python -m rewards\.train_digit_classifier --out \S+/nope`")
    folder = Path(shutil.copytree(CLASSIFIER_DIR, tmp_path / "classifier"))
    assert check_inputs(config_with(f"reward.options.digit_alignment.path={folder}")).notes == []
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    fails(config_with(f"reward.options.digit_alignment.path={folder}"),
          rf"{field}: \S+/model\.safetensors is truncated: its header places .*; copy or download it again")
    weights.unlink()
    fails(config_with(f"reward.options.digit_alignment.path={folder}"),
          rf"{field}: \S+/classifier has no model\.safetensors; rebuild it with `python -m "
          r"rewards\.train_digit_classifier --out \S+/classifier`")
    edit_json(folder / "config.json", format="something/else")
    shutil.copy(CLASSIFIER_DIR / "model.safetensors", weights)
    fails(config_with(f"reward.options.digit_alignment.path={folder}"),
          rf"{field}: \S+/config\.json is not a sol-rl/digit-classifier/v1 config \(format 'something/else'\)")


def test_an_unused_classifier_path_is_a_note_not_an_error(tmp_path):
    notes = check_inputs(config_with("reward.weights={jpeg_compressibility: 1.0}",
                                     f"reward.options.digit_alignment.path={tmp_path / 'nope'}")).notes
    assert notes == ["reward.options.digit_alignment is ignored: digit_alignment is not in reward.weights"]


def test_a_reward_models_missing_weight_file_is_named_with_its_source_before_anything_loads(tmp_path):
    det = tmp_path / "en_PP-OCRv4_det.onnx"
    fails(config_with("reward.weights={ocr: 1.0}", f"reward.options={{ocr: {{det_model_path: {det}}}}}"),
          rf"reward\.options\.ocr: missing {re.escape(str(det))} \(from det_model_path: a PP-OCR model "
          r"exported to ONNX \(paddle2onnx\)\)")
    quoted = tmp_path / "signs.txt"  # prompts the ocr reward can score: the target text in quotes
    quoted.write_text('a sign that says "one"\n', encoding="utf-8")
    ocr_on_signs = ["reward.weights={ocr: 1.0}", f"prompts.source={quoted}", f"prompts.eval_source={quoted}"]
    assert check_inputs(config_with(*ocr_on_signs)).notes == []  # the wheel's own models are there


# ---- cross-field rules and odd keep ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["prompts.keep=30", "prompts.candidates=24"],
         r"prompts\.keep \(30\) must be <= prompts\.candidates \(24\): keep is how many of the candidates are "
         r"regenerated"),
        (["learner.art.pairwise=true", "prompts.keep=4"],
         r"learner\.art\.pairwise \(true\) needs prompts\.keep = 2 \(given 4\): pairwise scores compare one winner "
         r"with one loser per prompt; set prompts\.keep=2 or learner\.art\.pairwise=false"),
        (["cluster.codec=lora", "training.mode=full"],
         r"cluster\.codec \(lora\) needs training\.mode = lora \(given full\): the lora codec ships only the sampling "
         r"adapter, and full training has none; set cluster\.codec=auto or training\.mode=lora"),
        (["learner.objective=art", "learner.decay.type=1"],
         r"learner\.objective \(art\) needs learner\.decay\.type = 0 \(given 1\): the target, the trust region and "
         r"the restoration all refer to the policy at the iteration's start, which must be the sampling policy "
         r"\(ART replaces the EMA-lagged sampler\); set learner\.decay\.type=0"),
        (["cluster.learner.count=9", "prompts.per_iteration=8"],
         r"cluster\.learner\.count \(9\) must be <= prompts\.per_iteration \(8\): each learner rank trains on whole "
         r"prompt slots; lower the count or raise prompts\.per_iteration"),
    ],
    ids=["keep>candidates", "pairwise", "lora codec", "art on-policy", "learner ranks"],
)
def test_cross_field_rules_fail_in_one_line_naming_both_fields(overrides, message):
    with pytest.raises(ConfigError) as info:
        config_with(*overrides)
    assert re.fullmatch(message, str(info.value)), str(info.value)


def test_check_inputs_applies_the_cross_field_rules_to_an_unvalidated_config():
    config = config_with()
    broken = config.model_copy(update={"prompts": config.prompts.model_copy(update={"keep": 200})})
    fails(broken, r"prompts\.keep \(200\) must be <= prompts\.candidates \(96\): .*")
    assert config_with("learner.art.pairwise=true", "prompts.keep=2").learner.art.pairwise


def test_check_inputs_validates_an_unvalidated_config_again_field_constraints_and_cluster_rules_too():
    config = config_with()
    fails(config.model_copy(update={"explore": config.explore.model_copy(update={"steps": 0})}),
          r"explore\.steps: Input should be greater than or equal to 1 \(given 0\)")
    lora_full = {"cluster": config.cluster.model_copy(update={"codec": "lora"}),
                 "training": config.training.model_copy(update={"mode": "full"})}
    fails(config.model_copy(update=lora_full),
          r"cluster\.codec \(lora\) needs training\.mode = lora \(given full\): .*")


def test_an_odd_keep_is_accepted_with_a_note():
    assert check_inputs(config_with("prompts.keep=5")).notes == [
        "prompts.keep=5 is odd: best_worst keeps the 2 best and 3 worst seeds per prompt (as the official code)"
    ]
    assert check_inputs(config_with("prompts.keep=5", "learner.selection=random")).notes == []
    assert check_inputs(config_with("prompts.keep=4")).notes == []
    assert check_inputs(config_with("prompts.keep=5", "prompts.candidates=5")).notes == []


# ---- the real command line -------------------------------------------------------------------------


def _bad_yaml(tmp: Path) -> list[str]:
    (tmp / "bad.yaml").write_text("run:\n  seed: 0\nexplore:\n  steps: [1,\n  solver: euler\n")
    return ["--config", str(tmp / "bad.yaml")]


def _bad_value(tmp: Path) -> list[str]:
    (tmp / "value.yaml").write_text("run:\n  seed: 0\nexplore:\n  steps: 0\n")
    return ["--config", str(tmp / "value.yaml")]


def _empty_prompts(tmp: Path) -> list[str]:
    (tmp / "prompts.txt").write_text("\n  \n")
    return ["--set", f"prompts.source={tmp / 'prompts.txt'}"]


def _model(tmp: Path, breaks) -> list[str]:
    folder = Path(shutil.copytree(EMBEDDED_MODEL, tmp / "model"))
    breaks(folder)
    return ["--set", f"model.path={folder}"]


CLI_CASES = {
    "yaml syntax in a file": (_bad_yaml, r"\S+/bad\.yaml line 6, column 1: expected ',' or '\]', but got "
                              r"'<stream end>' \(while parsing a flow sequence from line 4\); fix the YAML syntax "
                              r"there"),
    "yaml syntax in --set": (lambda t: ["--set", "explore.steps=[1,"],
                             r"--set explore\.steps=\[1,: .*; quote the value or fix its syntax"),
    "invalid value in a file": (_bad_value, r"\S+/value\.yaml line 4: explore\.steps: Input should be greater than "
                                r"or equal to 1 \(given 0\)"),
    "keep > candidates": (lambda t: ["--set", "prompts.keep=30", "--set", "prompts.candidates=24"],
                          r"prompts\.keep \(30\) must be <= prompts\.candidates \(24\): keep is how many of the "
                          r"candidates are regenerated"),
    "missing prompt file": (lambda t: ["--set", f"prompts.source={t / 'nope.txt'}"],
                            r"prompts\.source: prompt file \S+/nope\.txt does not exist .*"),
    "empty prompt file": (_empty_prompts, r"prompts\.source: prompt file \S+ holds no prompts .*"),
    "empty model folder": (lambda t: _model(t, lambda m: (shutil.rmtree(m), m.mkdir())),
                           r"model\.path: \S+/model is empty; .*"),
    "corrupt safetensors": (lambda t: _model(t, _corrupt_header),
                            r"model\.path: \S+\.safetensors has a corrupt safetensors header .*"),
    "unknown transformer class": (
        lambda t: _model(t, lambda m: edit_json(m / "transformer" / "config.json", _class_name="SD4Transformer")),
        r"model\.path: \S+/config\.json: no model family for transformer class 'SD4Transformer'; known: .*"),
}


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_the_launcher_reports_a_user_error_in_one_line_before_ray_starts(tmp_path, case):
    arguments, message = CLI_CASES[case]
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "cluster.launch", *arguments(tmp_path), "--run-dir", str(run_dir)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1, result.stderr
    assert re.fullmatch(rf"error: {message}", lines[0]), lines[0]
    assert not run_dir.exists()


def test_resuming_a_run_whose_config_yaml_is_broken_is_one_line(tmp_path):
    old = tmp_path / "old"
    (old / "checkpoint").mkdir(parents=True)
    (old / "config.yaml").write_text("run:\n  seed: 0\nprompts: {keep: 4\n")
    result = subprocess.run([sys.executable, "-m", "cluster.launch", "--resume", str(old)],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert re.fullmatch(r"error: \S+/old/config\.yaml line 4, column 1: .*; fix the YAML syntax there", lines[0]), lines
    assert sorted(p.name for p in old.iterdir()) == ["checkpoint", "config.yaml"]


def test_geneval_without_a_detector_stops_at_preflight_saying_what_to_install():
    text = fails(config_with("reward.weights={geneval: 1.0}"),
                 r"reward\.options\.geneval: the geneval reward needs an object detector, and reward\.options\.geneval"
                 r"\.detector names none\. GenEval's own is Mask2Former .*register_detector\(NAME\).*")
    assert "mmcv" in text


def test_a_truncated_or_unreadable_reward_file_is_named_before_anything_loads(tmp_path):
    folder = tmp_path / "imagereward"
    (folder / "bert-base-uncased").mkdir(parents=True)
    (folder / "bert-base-uncased" / "vocab.txt").write_text("[PAD]\n", encoding="utf-8")
    (folder / "ImageReward.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    (folder / "med_config.json").write_text("{not json", encoding="utf-8")
    overrides = ["reward.weights={imagereward: 1.0}", f"reward.options.imagereward.path={folder}"]
    fails(config_with(*overrides),
          r"reward\.options\.imagereward: \S+/ImageReward\.safetensors is truncated or not a safetensors file: .*"
          r"\(from huggingface\.co/THUDM/ImageReward\)")
    save_file({"w": torch.zeros(2)}, folder / "ImageReward.safetensors")
    fails(config_with(*overrides), r"reward\.options\.imagereward: \S+/med_config\.json is not JSON \(Expecting "
          r"property name .*\); copy or download it again \(from huggingface\.co/THUDM/ImageReward\)")
