"""docs/config.md's reference tables, generated from the schema so they cannot go stale.

    python -m cluster.config.reference      # rewrites the tables between docs/config.md's markers

Every field of `SolRLConfig` (its path, type, default and description, as pydantic holds them) and every
reward's options (the keyword arguments of its constructor, as `reward.options.<name>` passes them); a
test fails when the committed doc differs from what this prints.
"""

from __future__ import annotations

import inspect
import json
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from cluster.config.schema import SolRLConfig
from cluster.reports.doc_sections import splice

CONFIG_DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"  # absent in an installed wheel


def type_name(annotation: Any) -> str:
    """`Literal['a', 'b']` → `'a' \\| 'b'`, `int | None` → `int \\| None`, classes by name (escaped for tables)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " \\| ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(type_name(a) for a in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(type_name(a) for a in args)}]"
    return "None" if annotation is type(None) else getattr(annotation, "__name__", str(annotation))


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models a field holds (itself, or inside `X | None`)."""
    candidates = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) \
        else (annotation,)
    return [a for a in candidates if isinstance(a, type) and issubclass(a, BaseModel)]


def fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, str, str, str]]:
    """(path, type, default, description) of every leaf field, depth first in declaration order."""
    for name, info in model.model_fields.items():
        path, nested = prefix + name, _models(info.annotation)
        if nested and info.annotation is nested[0]:  # a section: its fields instead
            yield from fields(nested[0], path + ".")
            continue
        default = info.default_factory() if info.default is PydanticUndefined and info.default_factory else info.default
        shown = "required" if default is PydanticUndefined else json.dumps(default, default=str)
        yield path, type_name(info.annotation), shown, (info.description or "").replace("|", "\\|")
        for section in nested:  # an optional section (e.g. logging.wandb): its fields when it is given
            yield from fields(section, path + ".")


def fields_table() -> str:
    lines = ["| field | type | default | description |", "|---|---|---|---|"]
    lines += [f"| `{path}` | {kind} | `{default}` | {description} |" for path, kind, default, description
              in fields(SolRLConfig)]
    return "\n".join(lines) + "\n"


def reward_options_table() -> str:
    """Each registered reward's constructor keywords: what `reward.options.<name>` may set."""
    from rewards import known_rewards
    from rewards.base import reward_class

    lines = ["| reward | options (`reward.options.<reward>.<option>`, with their defaults) |", "|---|---|"]
    for name in known_rewards():
        if not reward_class(name).__module__.startswith("rewards."):
            continue  # registered by a caller (a test's stand-in), not shipped
        parameters = list(inspect.signature(reward_class(name)).parameters.values())
        options = [f"`{p.name}`" + ("" if p.default is inspect.Parameter.empty else f" = `{p.default!r}`")
                   for p in parameters if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
        lines.append(f"| `{name}` | {', '.join(options) or '—'} |")
    return "\n".join(lines) + "\n"


def current(doc: str) -> str:
    """`doc` with both generated tables regenerated."""
    doc = splice(doc, "config-fields", fields_table())
    return splice(doc, "reward-options", reward_options_table())


def main() -> None:
    CONFIG_DOC.write_text(current(CONFIG_DOC.read_text()))
    print(f"rewrote the generated tables of {CONFIG_DOC}")


if __name__ == "__main__":
    main()
