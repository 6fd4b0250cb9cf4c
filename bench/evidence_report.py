"""The evidence suite's report: every run file merged, the paper's tables rebuilt beside its numbers,
figures with per-seed bands. Written by `python -m bench.evidence --report` (no training).

Outputs: `docs/evidence.md` (the tables, generated: edit this module, not the file), the same tables
between the `<!-- evidence:begin/end -->` markers of `docs/benchmarks.md` (its prose stays hand-written),
`bench/results/evidence.json` (the tables' numbers and every run's points) and
`bench/results/evidence_<group>.png`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from bench import adaptive_explore, rank_fidelity
from bench.convergence import BASELINE, add_modeled_cost, first_reach, load_runs, plot, speedups

Runs = dict[str, dict[int, list[dict[str, Any]]]]

# The paper's rows (REFERENCE §1; HPSv2 unless said): what each table is put beside.
PAPER_CONVERGENCE = ("The paper: Sol-RL reaches DiffusionNFT's final reward 1.91× to 4.64× faster in training "
                     "time (SANA 2.42×, FLUX 3.00×, SD3.5-L 4.64× on ImageReward); naive_quant peaks lower "
                     "(HPSv2 ≈ 0.3595 against ≈ 0.3705).")
PAPER_TABLE_1 = {"flow_grpo": 0.3501, "diffusionnft": 0.3613, "sol_rl": 0.3688}  # FLUX, equal GPU-hours
PAPER_TABLE_2 = {2: 0.3587, 4: 0.3650, 6: 0.3686, 8: 0.3659}  # explore steps, SD3.5-M?, HPSv2
PAPER_TABLE_3 = {24: 0.3569, 48: 0.3622, 72: 0.3663, 96: 0.3686}  # pool size N with K = 24
EXPLORE_RUNS = {2: "sol_rl_explore2", 4: "sol_rl_explore4", 6: "sol_rl", 8: "sol_rl_explore8"}
POOL_RUNS = {24: "sol_rl_pool24", 48: "sol_rl_pool48", 72: "sol_rl_pool72", 96: "sol_rl"}
CONVERGENCE_RUNS = ("diffusionnft", "naive_scaling", "naive_quant", "sol_rl", "sol_rl_halving", "sol_rl_halving3",
                    "flow_grpo", "sol_rl_shuffled", "sol_rl_art")
FIGURES = {"algorithms": ("diffusionnft", "naive_scaling", "naive_quant", "sol_rl", "flow_grpo"),
           "explore_steps": tuple(EXPLORE_RUNS.values()), "pool_size": tuple(POOL_RUNS.values()),
           "controls": ("diffusionnft", "sol_rl", "sol_rl_shuffled", "sol_rl_art"),
           "adaptive": ("diffusionnft", "sol_rl", "sol_rl_halving", "sol_rl_halving3")}


def load_all(run_dir: Path) -> Runs:
    runs: Runs = {}
    for path in sorted(run_dir.glob("*.json")):
        loaded, _ = load_runs(path)
        for name, by_seed in loaded.items():
            runs.setdefault(name, {}).update(by_seed)
    add_modeled_cost(runs)
    return runs


def reward_at(points: list[dict[str, Any]], clock: str, when: float) -> float:
    """The held-out reward at `when` on `clock`, interpolated between evaluations (nan past the run)."""
    xs, ys = [p[clock] for p in points], [p["eval_reward"] for p in points]
    return float(np.interp(when, xs, ys)) if when <= xs[-1] else math.nan


def spread(values: list[float], digits: int = 3) -> str:
    """mean (min–max) [per seed: a, b, c] over the finite values; a seed whose value is not finite (a target
    never reached) shows as "never", and is left out of the mean."""
    finite = [v for v in values if math.isfinite(v)]
    per_seed = ", ".join(f"{v:.{digits}f}" if math.isfinite(v) else "never" for v in values)
    if not finite:
        return f"never [{per_seed}]"
    return f"{np.mean(finite):.{digits}f} ({min(finite):.{digits}f}–{max(finite):.{digits}f}) [{per_seed}]"


def never_as_nan(ratios: list[float]) -> list[float]:
    """`speedups` writes 0 for a run that never reached the target: shown as "never", not as a speedup."""
    return [r if r > 0 else math.nan for r in ratios]


def seeds_of(runs: Runs, names: tuple[str, ...] | list[str]) -> list[int]:
    """The seeds every run of `names` that exists has, and the baseline too."""
    present = [runs[n] for n in names if n in runs] + [runs.get(BASELINE, {})]
    return sorted(set.intersection(*(set(r) for r in present))) if present else []


def convergence_table(runs: Runs) -> tuple[str, dict]:
    names = [n for n in CONVERGENCE_RUNS if n in runs]
    summary = speedups({n: runs[n] for n in names}) if BASELINE in runs else {}
    lines = ["| run | seeds | final held-out `digit_margin` | final accuracy | final log p (`digit_alignment`) | "
             "speedup to diffusionnft's final reward, iterations | speedup, modeled GPU time |",
             "|---|---|---|---|---|---|---|"]
    for name in names:
        row = summary.get(name)
        if row is None:
            continue
        seeds = [s for s in runs[name] if s in runs[BASELINE]]  # the order of `speedups`' per-seed lists
        alignment = [runs[name][s][-1].get("eval_digit_alignment", math.nan) for s in seeds]
        accuracy = [math.nan if a is None else a for a in row["final_eval_accuracy"]]
        lines.append(f"| {name} | {len(seeds)} | {spread(row['final_eval_reward'])} | "
                     f"{spread(accuracy)} | {spread(alignment)} | "
                     f"{spread(never_as_nan(row['iteration']['per_seed']), 2)} | "
                     f"{spread(never_as_nan(row['modeled_s']['per_seed']), 2)} |")
    return "\n".join(lines) + f"\n\n{PAPER_CONVERGENCE}", summary


def equal_time_table(runs: Runs) -> tuple[str, dict]:
    """Table 1: each run's held-out reward at the budget every run of the table reached (per seed: the
    smallest final modeled time among them)."""
    names = [n for n in PAPER_TABLE_1 if n in runs]
    seeds = seeds_of(runs, names)
    out: dict[str, Any] = {"seeds": seeds, "budget_s": {}, "reward": {n: [] for n in names}}
    for seed in seeds:
        budget = min(runs[n][seed][-1]["modeled_s"] for n in names)
        out["budget_s"][seed] = budget
        for n in names:
            out["reward"][n].append(reward_at(runs[n][seed], "modeled_s", budget))
    lines = ["| run | held-out `digit_margin` at equal modeled GPU time | paper (FLUX, HPSv2) |", "|---|---|---|"]
    lines += [f"| {n} | {spread(out['reward'][n])} | {PAPER_TABLE_1[n]:.4f} |" for n in names]
    return "\n".join(lines), out


def ablation_table(runs: Runs, rows: dict[int, str], paper: dict[int, float], label: str) -> tuple[str, dict]:
    """Tables 2 and 3: per setting, the final held-out reward and the modeled time to diffusionnft's final
    reward (per seed; ∞: not reached)."""
    names = [rows[k] for k in rows if rows[k] in runs]
    seeds = seeds_of(runs, names)
    out: dict[str, Any] = {"seeds": seeds}
    lines = [f"| {label} | run | final held-out reward | modeled GPU time to diffusionnft's final reward (s) | "
             "paper (HPSv2) |", "|---|---|---|---|---|"]
    for key, name in rows.items():
        if name not in runs:
            continue
        final = [runs[name][s][-1]["eval_reward"] for s in seeds]
        reach = [first_reach(runs[name][s], runs[BASELINE][s][-1]["eval_reward"], "modeled_s") for s in seeds]
        out[name] = {"final": final, "time_to_target_s": reach}
        lines.append(f"| {key} | {name} | {spread(final)} | {spread(reach, 0)} | {paper[key]:.4f} |")
    own = [runs[BASELINE][s][-1]["modeled_s"] for s in seeds]
    out[BASELINE] = {"time_to_target_s": own}
    lines.append(f"| — | {BASELINE} (the target is its final reward) | — | {spread(own, 0)} | — |")
    return "\n".join(lines), out


def measured_tables(results: Path) -> list[tuple[str, str]]:
    """The tables of the two selection benches, where their JSON exists (they are not training runs)."""
    sections = []
    fidelity_json = results / "rank_fidelity_margin.json"
    if fidelity_json.exists():
        sections.append(("Table 8: rank fidelity on `digit_margin` (bench.rank_fidelity)",
                         rank_fidelity.format_table(json.loads(fidelity_json.read_text()))))
    adaptive_json = results / "adaptive_explore.json"
    if adaptive_json.exists():
        data = json.loads(adaptive_json.read_text())
        sections.append((f"Adaptive exploration: selection of the best and worst {data['keep'] // 2} against "
                         f"full precision (bench.adaptive_explore, {data['args']['prompts']} prompts)",
                         adaptive_explore.format_table(data["results"], data["fixed_steps"])))
    return sections


def splice(doc: Path, body: str, begin: str = "<!-- evidence:begin -->", end: str = "<!-- evidence:end -->") -> None:
    """Replace what lies between the markers of `doc` by `body` (the tables in docs/benchmarks.md are
    these generated ones, so the two files cannot disagree)."""
    text = doc.read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"{doc} lacks the markers {begin} … {end} that say where the tables go")
    head, rest = text.split(begin, 1)
    doc.write_text(f"{head}{begin}\n{body}\n{end}{rest.split(end, 1)[1]}")


def report(run_dir: Path, results: Path, doc: Path = Path("docs/evidence.md"),
           discussion: Path | None = Path("docs/benchmarks.md")) -> None:
    runs = load_all(run_dir)
    results.mkdir(parents=True, exist_ok=True)
    if BASELINE not in runs:
        raise SystemExit(f"no {BASELINE} run in {run_dir}: it sets every table's target")
    sections, numbers = [], {}
    text, numbers["convergence"] = convergence_table(runs)
    sections.append(("Convergence (the paper's Figure/Table 6 protocol): speedup to diffusionnft's final "
                     "held-out reward", text))
    text, numbers["table1"] = equal_time_table(runs)
    sections.append(("Table 1: held-out reward at equal modeled GPU time", text))
    text, numbers["table2"] = ablation_table(runs, EXPLORE_RUNS, PAPER_TABLE_2, "explore steps")
    sections.append(("Table 2: explore steps (N = 96, K = 24)", text))
    text, numbers["table3"] = ablation_table(runs, POOL_RUNS, PAPER_TABLE_3, "pool N")
    sections.append(("Table 3: pool size (K = 24, 6 explore steps)", text))
    sections += measured_tables(results)
    inventory = "\n".join(f"- `{n}`: seeds {sorted(by_seed)}" for n, by_seed in sorted(runs.items()))
    sections.append(("Runs in this report", inventory))

    body = "\n\n".join(f"## {title}\n\n{text}" for title, text in sections)
    if discussion is not None:
        splice(discussion, "\n\n".join(f"#### {title}\n\n{text}" for title, text in sections[:-1]))
    doc.write_text("# Evidence on the embedded world (generated)\n\nWritten by `python -m bench.evidence "
                   "--report` from `bench/results/runs/*.json`; do not edit by hand. Cells: mean (min–max) "
                   "[per seed]. The discussion is in [benchmarks.md](benchmarks.md).\n\n" + body + "\n")
    print(body)
    for group, names in FIGURES.items():
        subset = {n: {s: runs[n][s] for s in seeds_of(runs, [m for m in names if m in runs])}
                  for n in names if n in runs}
        if len(subset) > 1:
            plot(subset, results / f"evidence_{group}.png", ylabel="held-out digit_margin")
    (results / "evidence.json").write_text(json.dumps({"tables": numbers, "runs": runs}, indent=1, default=str) + "\n")
    print(f"wrote {doc}, {results / 'evidence.json'} and the figures")
