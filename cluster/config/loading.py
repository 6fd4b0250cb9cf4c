"""Reading a run's configuration: a YAML preset, `--set` overrides, and errors that name the line.

A problem is reported in one line with the field path, the file and line (or the override) that
set it, and the fix; `cluster.config.schema` holds what the fields are and the rules across them.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from cluster.config.schema import SolRLConfig
from learner.config import RULE_ERROR


class ConfigError(ValueError):
    """A configuration problem, stated with the field path and the fix."""


def apply_override(tree: dict[str, Any], override: str) -> None:
    if "=" not in override:
        raise ConfigError(f"--set {override!r}: write it as key.path=value, e.g. explore.precision=fp8")
    key, raw = override.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {override}: {_yaml_problem(exc, with_lines=False)[0]}; "
                          "quote the value or fix its syntax") from None
    node = tree
    parts = key.strip().split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {override!r}: {part!r} is a value, not a section")
        node = child
    node[parts[-1]] = value


KeyPath = tuple[str, ...]
Locate = Callable[[KeyPath, bool], str | None]


def one_line(text: str) -> str:
    """A message as one line: user errors are printed as a single `error:` line."""
    return " ".join(text.split())


def _yaml_problem(exc: yaml.YAMLError, *, with_lines: bool) -> tuple[str, yaml.Mark | None]:
    """The parser's complaint in one line, and where it is. Its str() spans several lines and names
    `<unicode string>`, which tells a user nothing."""
    if isinstance(exc, yaml.MarkedYAMLError) and (exc.problem or exc.context):
        problem = exc.problem or exc.context or ""
        if exc.problem and exc.context:
            started = exc.context_mark
            at = f" from line {started.line + 1}" if with_lines and started is not None else ""
            problem = f"{exc.problem} ({exc.context}{at})"
        return one_line(problem), exc.problem_mark
    return one_line(str(exc).splitlines()[0] if str(exc) else type(exc).__name__), None


def _key_lines(node: yaml.Node | None, prefix: KeyPath = ()) -> dict[KeyPath, int]:
    """The 1-based line of every key (and list item) of a composed YAML document, by key path."""
    lines: dict[KeyPath, int] = {}
    if isinstance(node, yaml.MappingNode):
        children = [((*prefix, str(k.value)), k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode)]
    elif isinstance(node, yaml.SequenceNode):
        children = [((*prefix, str(i)), item, item) for i, item in enumerate(node.value)]
    else:
        return lines
    for path, marked, value in children:
        lines[path] = marked.start_mark.line + 1
        lines.update(_key_lines(value, path))
    return lines


def _read_config_file(path: str | Path) -> tuple[dict[str, Any], dict[KeyPath, int]]:
    """A preset's tree and the line of each of its keys; every problem is a one-line ConfigError."""
    file = Path(path)
    if file.is_dir():
        raise ConfigError(f"config file {file} is a directory; name a YAML preset, e.g. configs/embedded.yaml")
    if not file.is_file():
        raise ConfigError(f"config file {file} does not exist; presets live in configs/")
    data = file.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"config file {file} is not UTF-8 text (byte 0x{data[exc.start]:02x} at line {line}); "
                          "save it as UTF-8") from None
    # One parse gives both the node graph (for line numbers) and the data, as yaml.safe_load would.
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        tree = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        problem, mark = _yaml_problem(exc, with_lines=True)
        where = f"{file} line {mark.line + 1}, column {mark.column + 1}" if mark is not None else str(file)
        raise ConfigError(f"{where}: {problem}; fix the YAML syntax there") from None
    finally:
        loader.dispose()
    if tree is None:  # an empty file, or only comments: the defaults
        return {}, {}
    if not isinstance(tree, dict):
        raise ConfigError(f"{file}: the top level must be a mapping of sections (given a {type(tree).__name__})")
    return tree, _key_lines(node)


def _locator(file: str | Path, lines: dict[KeyPath, int], overrides: Sequence[str]) -> Locate:
    """Where a field's value came from: 'FILE line N' for a preset key, None for a --set value (the
    message already names the field the user typed) or a default."""
    overridden = [tuple(o.split("=", 1)[0].strip().split(".")) for o in overrides if "=" in o]

    def locate(path: KeyPath, exact: bool) -> str | None:
        for key in overridden:
            n = min(len(key), len(path))
            if key[:n] == path[:n]:  # set by --set itself, or inside a section --set replaced
                return None
        # Not exact: pydantic may append a union member's tag to a path, so the longest prefix in the
        # preset is the key; a cross-field rule names its fields exactly.
        for end in range(len(path), len(path) - 1 if exact else 0, -1):
            if path[:end] in lines:
                return f"{file} line {lines[path[:end]]}"
        return None

    return locate


def _given(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _describe(error: ValidationError, locate: Locate | None = None) -> list[str]:
    """One line per problem: where (preset file and line, when known), the field, what is wrong."""
    lines = []
    for item in error.errors():
        loc: KeyPath = tuple(str(p) for p in item["loc"])
        path = ".".join(loc) or "(top level)"
        if item["type"] == RULE_ERROR:
            # The whole tree is the input here: the message names the fields and values instead.
            text = item["msg"]
            fields = [tuple(f.split(".")) for f in (item.get("ctx") or {}).get("fields", ())]
            where = next((w for w in (locate(f, True) for f in fields) if w), None) if locate else None
        else:
            if item["type"] == "extra_forbidden":
                text = f"{path}: unknown field (given {_given(item.get('input'))}); check the spelling against the docs"
            elif item["type"] == "missing" or not loc:
                text = f"{path}: {item['msg'].removeprefix('Value error, ')}"
            else:
                text = f"{path}: {item['msg'].removeprefix('Value error, ')} (given {_given(item.get('input'))})"
            where = locate(loc, False) if locate else None
        lines.append(one_line(f"{where}: {text}" if where else text))
    return lines


def _read_preset(path: Path, seen: tuple[Path, ...] = ()) -> tuple[dict[str, Any], dict[KeyPath, int]]:
    """A preset's tree with its `base:` preset (a path relative to it) underneath: a variant states only
    what differs. The line of each key is the variant's own (a base's keys are not located)."""
    tree, lines = _read_config_file(path)
    base = tree.pop("base", None)
    if base is None:
        return tree, lines
    if not isinstance(base, str):
        raise ConfigError(f"{path}: base must name a preset file (given {base!r})")
    base_path = (path.parent / base).resolve()
    if base_path in seen or base_path == path.resolve():
        raise ConfigError(f"{path}: base {base} leads back to itself; a preset's bases must not form a loop")
    under, _ = _read_preset(base_path, (*seen, path.resolve()))
    return _merged(under, tree), lines


def _merged(base: dict[str, Any], variant: dict[str, Any]) -> dict[str, Any]:
    """`variant` over `base`: sections merged key by key, any other value replaced whole."""
    out = dict(base)
    for key, value in variant.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _parse(tree: dict[str, Any], locate: Locate | None) -> SolRLConfig:
    try:
        return SolRLConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError("; ".join(_describe(exc, locate))) from None


def parse_config(tree: dict[str, Any]) -> SolRLConfig:
    """Validate a config tree; a ConfigError's message is one line (several problems joined by '; ')."""
    return _parse(tree, None)


def revalidate(config: SolRLConfig) -> SolRLConfig:
    """`config` validated again from its dump (as config.yaml holds it): every field constraint and rule, with
    the messages `load_config` gives. For a config built without validation — `model_copy(update=...)` and
    `model_construct` skip validators — the first stage of `cluster.config.preflight.check_inputs`."""
    return _parse(config.model_dump(mode="json"), None)


# The embedded world's preset, found from this file, not from the current directory (a checkout's configs/).
DEFAULT_PRESET = Path(__file__).resolve().parents[2] / "configs" / "embedded.yaml"


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """--config and --set, as every command that reads a config takes them."""
    default = str(DEFAULT_PRESET) if DEFAULT_PRESET.is_file() else "configs/embedded.yaml"
    parser.add_argument("--config", default=default,
                        help="the YAML preset (default: the embedded world, configs/embedded.yaml)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override one field after the preset, e.g. --set prompts.keep=12 (repeatable)")


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> SolRLConfig:
    """Read a YAML preset (or the defaults), apply `key.path=value` overrides, validate.

    A resumed run's own config.yaml goes through here too, so its errors read the same."""
    overrides = list(overrides or [])
    tree: dict[str, Any] = {}
    lines: dict[KeyPath, int] = {}
    if path is not None:
        tree, lines = _read_preset(Path(path))
    for override in overrides:
        apply_override(tree, override)
    return _parse(tree, _locator(path, lines, overrides) if path is not None else None)
