"""The model card of an export: README.md with the YAML front matter the Hugging Face hub reads, and a text a
reader of the hub page wants — what was trained, on which reward, how long, how it scored before and after, the
samples, how to load it, and the command that reproduces the run.

The front matter is written by huggingface_hub's own `ModelCardData` (so the hub parses it): `base_model` (the
hub repo the run resolved, when it came from the hub), `library_name: diffusers`, `pipeline_tag:
text-to-image`, tags, and the licence inherited from the base model's own card (`license`, `license_name`,
`license_link`; a relative link made absolute on the base repo's page). A base without a card gives `license:
other` and says to check the base model's terms.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster.config.schema import SolRLConfig
from learner.rollouts import evaluation_sampling

CARD_FILE = "README.md"
SAMPLES_FILE = "samples.png"
ALGORITHMS = {  # learner.algorithms' names, as a reader of the card knows them
    "sol_rl": "Sol-RL (arXiv 2604.06916): explore many seeds in low precision, train on the best and worst",
    "diffusionnft": "DiffusionNFT's own sampling, in full precision (arXiv 2509.16117)",
    "naive_scaling": "a large seed pool explored in full precision",
    "naive_quant": "exploration and training samples both in low precision",
}
OBJECTIVES = {"nft": "DiffusionNFT (arXiv 2509.16117)", "art": "DiffusionART (arXiv 2610.12572)",
                        "flow_grpo": "Flow-GRPO"}
LICENCE_KEYS = ("license", "license_name", "license_link")


@dataclass(frozen=True)
class RunFacts:
    """What the card states about the run, gathered by the export from the run directory."""

    config: SolRLConfig  # as the run was given it (hub ids, not snapshots)
    iteration: int  # the exported checkpoint's: iterations trained
    policy: str  # ema | theta | old
    base_model: str | None  # the base's hub repo id, or None for a local folder
    base_commit: str | None
    base_card: Path | None  # the base model's README.md, when it has one
    before: dict[str, float] = field(default_factory=dict)  # held-out metrics of the base model
    after: dict[str, float] = field(default_factory=dict)  # ... at the exported checkpoint's last evaluation
    after_iteration: int | None = None  # the (0-based) iteration that evaluation followed
    commands: list[list[str]] = field(default_factory=list)  # the run's launches, as argv
    has_samples: bool = False


def inherited_licence(card: Path | None, base_model: str | None) -> dict[str, str]:
    """license / license_name / license_link of the base model's card ({"license": "other"} without one)."""
    from huggingface_hub import ModelCard

    data: dict[str, Any] = {}
    if card is not None and card.is_file():
        data = ModelCard.load(card).data.to_dict()
    licence = {key: str(data[key]) for key in LICENCE_KEYS if data.get(key)}
    link = licence.get("license_link")
    if link and base_model and "://" not in link:
        licence["license_link"] = f"https://huggingface.co/{base_model}/blob/main/{link}"
    return licence or {"license": "other"}


def _metrics_table(before: dict[str, float], after: dict[str, float], at: int | None) -> str:
    names = [name for name in before if name in after] or sorted(after)
    if not names:
        return "No held-out evaluation was logged.\n"
    when = "" if at is None else f" (evaluated after {at + 1} iteration{'s' if at else ''})"
    rows = [f"| held-out metric | base model | this model{when} |", "|---|---|---|"]
    for name in names:
        base = f"{before[name]:.4f}" if name in before else "—"
        rows.append(f"| `{name}` | {base} | {after[name]:.4f} |")
    return "\n".join(rows) + "\n"


def model_card(facts: RunFacts) -> str:
    """README.md's text: front matter, then the body (see the module docstring)."""
    from huggingface_hub import ModelCardData

    c = facts.config
    tags = ["diffusers", "text-to-image", "reinforcement-learning", "sol-rl", c.learner.algorithm.replace("_", "-"),
            *(f"reward-{name}" for name in c.reward.weights)]
    if c.training.mode == "lora":
        tags.append("lora")
    data = ModelCardData(base_model=facts.base_model, library_name="diffusers", pipeline_tag="text-to-image",
                         tags=tags, **inherited_licence(facts.base_card, facts.base_model))
    base = (f"[{facts.base_model}](https://huggingface.co/{facts.base_model})"
            + (f" (commit `{facts.base_commit[:12]}`)" if facts.base_commit else "")
            if facts.base_model else "the embedded digit model" if c.model.path == "embedded"
            else f"`{c.model.path}` (a local folder)")
    rewards = ", ".join(f"`{name}` × {weight:g}" for name, weight in c.reward.weights.items())
    training = (f"LoRA rank {c.training.lora_rank}, α {c.training.lora_alpha}, merged into the transformer"
                if c.training.mode == "lora" else "full fine-tuning")
    sampling = evaluation_sampling(c)
    lines = [
        f"# {c.run.name}: {facts.base_model or Path(c.model.path).name} post-trained with reinforcement learning",
        "",
        f"The transformer of {base}, trained for {facts.iteration} iterations with "
        f"{ALGORITHMS.get(c.learner.algorithm, c.learner.algorithm)}, updated by the "
        f"{OBJECTIVES.get(c.learner.objective, c.learner.objective)} objective. This folder is the "
        f"{'EMA of the trained weights (what evaluation saw)' if facts.policy == 'ema' else facts.policy + ' policy'};"
        " every other component is the base model's.",
        "",
        "| | |", "|---|---|",
        f"| reward | {rewards} |",
        f"| iterations | {facts.iteration}: {c.prompts.per_iteration} prompts each, {c.prompts.candidates} seeds "
        f"explored per prompt ({c.explore.precision}, {c.explore.steps} steps), {c.prompts.keep} trained on |",
        f"| training | {training}; lr {c.training.lr:g}, {c.sampler.steps} regeneration steps ({c.sampler.solver}) |",
        f"| prompts | training `{c.prompts.source}`, held out `{c.prompts.eval_source}` |",
        "",
        "## Held-out evaluation",
        "",
        _metrics_table(facts.before, facts.after, facts.after_iteration),
        f"{c.eval.prompts} held-out prompts × {c.eval.seeds_per_prompt} seeds, {sampling.steps} steps of "
        f"{sampling.solver}, CFG {sampling.cfg_scale:g}, the same seeds before and after.",
        "",
    ]
    if facts.has_samples:
        lines += ["## Samples", "", f"![Base model (left half of each row) and this model (right half), same prompts "
                  f"and seeds]({SAMPLES_FILE})", ""]
    lines += ["## Use", "", "```python", "from diffusers import DiffusionPipeline", "",
              "pipe = DiffusionPipeline.from_pretrained(\"THIS_REPO_OR_FOLDER\")", "```", ""]
    if facts.commands:
        lines += ["## Reproduce", "", "With this project (`make .venv/.installed`), the run's launches in order:", "",
                  "```bash", *(shlex.join(argv) for argv in facts.commands), "```", ""]
    return f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines)
