"""Load a diffusers-format model folder into a `FlowPolicy`.

A folder is what `DiffusionPipeline.save_pretrained` writes: `model_index.json`, one sub-folder per
component (`transformer/`, `text_encoder*/`, `tokenizer*/`, optional `vae/`, `scheduler/`). Each
component is loaded with the class named in `model_index.json`, from local files only, weights
from safetensors only (no pickle). The family is read from the transformer's class. The embedded
tiny model and SD3.5-Large go through this same function.
"""

from __future__ import annotations

import fnmatch
import importlib
import json
import math
import os
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from diffusion.config import ModelConfig
from diffusion.families import family_for_transformer
from diffusion.policy import FlowPolicy
from diffusion.samplers import SigmaGrid

_LIBRARIES = ("diffusers", "transformers")
# What a component folder holds that the loader reads: configs, tokenizer files, safetensors weights. Variant
# weights (`model.fp16.safetensors`, `….fp16-00001-of-00002.safetensors`, their `.index.fp16.json`) are
# loaded only when asked for, which this loader never does, and pickles never.
_COMPONENT_FILES = ("*.json", "*.txt", "*.model", "*.safetensors")
_NOT_LOADED = ("*.*.safetensors", "*.safetensors.index.*.json", "*.bin.index.json", "*.msgpack.index.json")
# The component folders of the families here, for naming a download before model_index.json is at hand.
COMMON_COMPONENTS = ("transformer", "vae", "scheduler", "text_encoder", "text_encoder_2", "text_encoder_3",
                     "tokenizer", "tokenizer_2", "tokenizer_3")


def listed_components(index: dict) -> list[str]:
    """The components model_index.json lists, in its order: metadata (`_…`) and `[null, null]` entries skipped."""
    return [name for name, spec in index.items()
            if not name.startswith("_") and isinstance(spec, list) and spec and spec[0] is not None]


def pipeline_patterns(components: Iterable[str]) -> tuple[list[str], list[str]]:
    """(include, exclude) fnmatch patterns of the files `load_policy` reads from a folder with these components:
    model_index.json and each component's configs, tokenizer files and weights; the rest of a hub repo (single-
    file checkpoints at its root, other formats, variants) excluded. Shared by the hub download
    (`diffusion.hub`) and the export (`pipeline_files`), so both take exactly what the loader loads."""
    include = ["model_index.json", *(f"{name}/{pattern}" for name in components for pattern in _COMPONENT_FILES)]
    exclude = [f"{name}/{pattern}" for name in components for pattern in _NOT_LOADED]
    return include, exclude


def weight_files(component: Path) -> list[Path]:
    """The safetensors files of a component folder that its `from_pretrained` reads: variants left out."""
    return [path for path in sorted(component.glob("*.safetensors"))
            if not any(fnmatch.fnmatch(path.name, pattern) for pattern in _NOT_LOADED)]


def pipeline_files(folder: str | os.PathLike) -> list[str]:
    """The files of a model folder that `load_policy` reads (`pipeline_patterns` of its model_index.json), as
    paths relative to it: what an export copies, whatever else the folder holds (a hub snapshot's
    single-file checkpoints, a user's notes)."""
    from huggingface_hub.utils import filter_repo_objects

    folder = Path(folder)
    include, exclude = pipeline_patterns(listed_components(json.loads((folder / "model_index.json").read_text())))
    present = sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file())
    return list(filter_repo_objects(present, allow_patterns=include, ignore_patterns=exclude))


def _resolve_device(device: str | torch.device) -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _require(path: Path, what: str) -> None:
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is missing: {what}. A model folder is what diffusers' save_pretrained writes "
            "(model_index.json, transformer/, text_encoder/, tokenizer/, scheduler/, optional vae/)."
        )


def _component_class(library: str, class_name: str) -> type:
    if library not in _LIBRARIES:
        raise ValueError(f"component library {library!r} is not loadable here; expected one of {_LIBRARIES}")
    module = __import__(library)
    try:
        return getattr(module, class_name)
    except AttributeError as exc:
        raise ValueError(f"{library} has no class {class_name!r} (named in model_index.json)") from exc


def _load_component(folder: Path, name: str, library: str, class_name: str, dtype: torch.dtype):
    path = folder / name
    _require(path, f"component {name!r} is listed in model_index.json")
    cls = _component_class(library, class_name)
    if name.startswith("tokenizer"):
        tokenizer = cls.from_pretrained(str(path), local_files_only=True)
        # An offline hub lookup can silently yield a 2-token tokenizer; a real one is never that small.
        if len(tokenizer) <= 2:
            raise ValueError(f"tokenizer in {path} has only {len(tokenizer)} tokens: its files are incomplete")
        return tokenizer
    if name == "scheduler":
        return None  # the samplers build their σ grid from the config (see load_policy)
    weights = weight_files(path)
    if not weights:
        raise FileNotFoundError(
            f"{path} has no *.safetensors weights (only safetensors are loaded, never pickle files)"
        )
    model = cls.from_pretrained(str(path), torch_dtype=dtype, use_safetensors=True, local_files_only=True)
    return model.eval().requires_grad_(False)


def load_policy(
    path: str | os.PathLike,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    shift: float | None = None,
    resolution: int | None = None,
    guidance: float | None = None,
    offload_text_encoders: bool = False,
    sequential_decode: bool = False,
    sigma_grid: SigmaGrid = "scheduler",
) -> FlowPolicy:
    """Load a model folder. `shift` overrides the scheduler's time shift; `resolution` (pixels) the
    transformer's default sample size; `guidance` the family's distilled guidance value (FLUX);
    `offload_text_encoders` and `sequential_decode` are `FlowPolicy`'s memory options; `sigma_grid` its σ grid."""
    folder = Path(path)
    _require(folder, "the model folder does not exist")
    _require(folder / "model_index.json", "model_index.json names the folder's components")
    index = json.loads((folder / "model_index.json").read_text())
    _require(folder / "transformer" / "config.json", "the transformer's config")
    transformer_class = json.loads((folder / "transformer" / "config.json").read_text())["_class_name"]
    family = family_for_transformer(transformer_class)
    if not family.supported:
        raise NotImplementedError(f"{folder}: model family {family.name!r} is not supported yet: {family.note}")

    target = _resolve_device(device)
    components: dict[str, nn.Module] = {}
    for name in listed_components(index):
        component = _load_component(folder, name, *index[name][:2], dtype)
        # With offload, text encoders stay where they were loaded (the CPU): never a peak on the device.
        stays = offload_text_encoders and name in family.text_components
        if component is not None:
            moves = isinstance(component, nn.Module) and not stays
            components[name] = component.to(target) if moves else component
    if "transformer" not in components:
        raise ValueError(f"{folder}/model_index.json lists no transformer")

    scheduler_config = folder / "scheduler" / "scheduler_config.json"
    _require(scheduler_config, "the scheduler config gives the time shift")
    scheduler = json.loads(scheduler_config.read_text())
    return FlowPolicy(
        family,
        components,
        scheduler=scheduler,
        latent_shape=family.latent_shape(components, resolution),
        device=target,
        dtype=dtype,
        shift=shift,
        guidance=guidance,
        offload_text_encoders=offload_text_encoders,
        sequential_decode=sequential_decode,
        sigma_grid=sigma_grid,
    )


def load_policy_from_config(config: ModelConfig) -> FlowPolicy:
    """load_policy with the config's folder, device, dtype (auto: bfloat16 on CUDA, else float32) and options."""
    device = _resolve_device(config.device)
    if config.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("model.device is 'cuda' but no CUDA device is visible: set model.device=auto or cpu")
    if config.dtype == "auto":
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    else:
        dtype = getattr(torch, config.dtype)
    return load_policy(config.folder(), device=device, dtype=dtype, shift=config.shift, resolution=config.resolution,
                       guidance=config.guidance, offload_text_encoders=config.offload_text_encoders,
                       sequential_decode=config.sequential_decode, sigma_grid=config.sigma_grid)


# ---- checks without loading (run by the launcher before any actor starts) ---------------------------

_SAFETENSORS_MAX_HEADER = 100_000_000  # the safetensors library refuses larger headers
_DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}
_RECOPY = "copy or download it again"


def check_safetensors(path: str | os.PathLike) -> None:
    """Raise ValueError (one line) unless `path` is a whole safetensors file: a readable JSON header
    whose tensors exactly cover the rest of the file. Reads the header only, never the weights."""
    file = Path(path)
    size = file.stat().st_size
    with file.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise ValueError(f"{file} is not a safetensors file ({size} bytes, not even the header length); {_RECOPY}")
        length = int.from_bytes(prefix, "little")
        if length > min(size - 8, _SAFETENSORS_MAX_HEADER):
            raise ValueError(f"{file} is truncated or not a safetensors file: its header length ({length} bytes) "
                             f"exceeds the file ({size} bytes); {_RECOPY}")
        raw = handle.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
        if not isinstance(header, dict):
            raise ValueError("not a JSON object")
        end = 0
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, stop = (int(x) for x in info["data_offsets"])
            width = _DTYPE_BYTES.get(info["dtype"])
            count = math.prod(int(d) for d in info["shape"])
            if not 0 <= begin <= stop or (width is not None and stop - begin != count * width):
                raise ValueError(f"tensor {name!r} has offsets [{begin}, {stop}] that do not fit its dtype and shape")
            end = max(end, stop)
    except (ValueError, TypeError, KeyError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"{file} has a corrupt safetensors header ({' '.join(str(exc).split())}); {_RECOPY}") from None
    data = size - 8 - length
    if end > data:
        raise ValueError(f"{file} is truncated: its header places tensor data up to byte {end} but the file holds "
                         f"{data} bytes of data; {_RECOPY}")
    if end < data:
        raise ValueError(f"{file} is corrupt: it holds {data} bytes of tensor data but its header accounts for {end}; "
                         f"{_RECOPY}")


def _read_json(file: Path, what: str) -> dict:
    if not file.is_file():
        raise FileNotFoundError(f"{file} is missing: {what}")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{file} is not valid JSON ({' '.join(str(exc).split())}); {what}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{file} must hold a JSON object; {what}")
    return data


def _has_class(library: str, class_name: str) -> bool:
    module = importlib.import_module(library)
    # Both libraries import lazily: dir() lists every exported class without importing its module
    # (diffusers' models alone take seconds); hasattr covers anything dir() leaves out.
    return class_name in dir(module) or hasattr(module, class_name)


def check_model_folder(path: str | os.PathLike) -> None:
    """Check a model folder as `load_policy` will read it, without loading any weights.

    Raises FileNotFoundError, ValueError or NotImplementedError with a one-line message naming the file
    and the fix: the folder, model_index.json and each listed component's folder, the family of the
    transformer class, the classes named, configs, and every safetensors header (truncated files too).
    """
    folder = Path(path)
    hint = ("a model folder is what diffusers' save_pretrained writes (model_index.json, transformer/, "
            "text_encoder/, tokenizer/, scheduler/, optional vae/)")
    if not folder.exists():
        raise FileNotFoundError(f"{folder} does not exist; {hint}")
    if not folder.is_dir():
        raise NotADirectoryError(f"{folder} is a file, not a folder; {hint}")
    if not any(folder.iterdir()):
        raise FileNotFoundError(f"{folder} is empty; {hint}")
    index_file = folder / "model_index.json"
    index = _read_json(index_file, f"it names the folder's components; {hint}")

    components: dict[str, tuple[str, str]] = {}
    for name, spec in index.items():
        if name.startswith("_") or not isinstance(spec, list) or (spec and spec[0] is None):
            continue  # metadata, or a component saved as None: load_policy skips these too
        if len(spec) != 2 or not all(isinstance(s, str) for s in spec):
            raise ValueError(f"{index_file}: entry {name!r} must be [library, class] or [null, null], got {spec}")
        components[name] = (spec[0], spec[1])
    if "transformer" not in components:
        raise ValueError(f"{index_file} lists no transformer; {hint}")
    for name in components:
        component = folder / name
        if not component.is_dir():
            raise FileNotFoundError(f"{component} is missing: component {name!r} is listed in {index_file}; "
                                    "restore the folder or set its entry to [null, null]")
        if not any(component.iterdir()):
            raise FileNotFoundError(f"{component} is empty: component {name!r} is listed in {index_file}")

    # The family comes first: it needs neither diffusers nor transformers imported.
    transformer_config = folder / "transformer" / "config.json"
    config_class = _read_json(transformer_config, "the transformer's config").get("_class_name")
    for class_name, where in ((components["transformer"][1], index_file), (config_class, transformer_config)):
        try:
            family = family_for_transformer(str(class_name))
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        if not family.supported:
            raise NotImplementedError(f"{where}: model family {family.name!r} is not supported yet: {family.note}")
    if config_class != components["transformer"][1]:
        raise ValueError(f"{transformer_config} names {config_class} but {index_file} names "
                         f"{components['transformer'][1]}; the folder mixes two models: restore one of them")

    _read_json(folder / "scheduler" / "scheduler_config.json", "the scheduler config gives the time shift")

    for name in components:
        component = folder / name
        if name != "scheduler" and not name.startswith("tokenizer"):
            _read_json(component / "config.json", f"the config of component {name!r}")
            weights = weight_files(component)
            if not weights:
                raise FileNotFoundError(f"{component} has no *.safetensors weights (only safetensors are loaded, never "
                                        "pickle files); convert them with save_pretrained(safe_serialization=True)")
            for shard_index in component.glob("*.safetensors.index.json"):
                shards = set(_read_json(shard_index, "it maps tensors to shard files").get("weight_map", {}).values())
                missing = sorted(str(s) for s in shards if not (component / str(s)).is_file())
                if missing:
                    raise FileNotFoundError(f"{shard_index} names shard {missing[0]}, which is missing; {_RECOPY}")
            for file in weights:
                check_safetensors(file)

    for name, (library, class_name) in components.items():
        if library not in _LIBRARIES:
            raise ValueError(f"{index_file}: component {name!r} comes from {library!r}, which is not loadable here; "
                             f"expected one of {', '.join(_LIBRARIES)}")
        if not _has_class(library, class_name):
            raise ValueError(f"{index_file}: {library} has no class {class_name!r} (component {name!r}); check the "
                             "spelling, or the installed version of the library")
