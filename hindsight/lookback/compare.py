"""Two RL runs side by side, prompt by prompt: what each answered to the same prompt.

Prompts are lined up by their hash (`lookback.traces.prompt_hash`, also each trace's
`hindsight.prompt_hash` tag, so the same lookup works in MLflow's trace search).

- Training samples (`--step N`): the prompts run A sampled at step N; for each, run B's samples
  of the same prompt at step N, or else at B's nearest stored step that sampled it (two runs
  with different seeds draw their prompts in different orders).
- Evaluation (`--eval`): both runs' greedy answers to the eval prompts after the same step.

Both read only the run directories (`rl/rollouts`, `rl/scores`, `rl/evals`).
"""
from __future__ import annotations

import html
import json
from pathlib import Path

from hindsight.errors import CheckpointError
from hindsight.lookback.report import group_table, page
from hindsight.lookback.traces import prompt_hash
from hindsight.state.rundir import RLDir
from hindsight.state.store import RolloutStore


def _samples(store: RolloutStore, shard: int, wanted: set[str] | None = None) -> dict[str, dict]:
    """prompt hash -> {"prompt", "step", "rows", "scores"} of one stored step (1-based `step`)."""
    rows, scores = store.read("rollouts", shard), store.read("scores", shard)
    by_index = {s["index"]: s for s in scores}
    out: dict[str, dict] = {}
    for r in rows:
        h = prompt_hash(str(r["prompt"]))
        if wanted is None or h in wanted:
            entry = out.setdefault(h, {"prompt": r["prompt"], "step": shard + 1, "rows": [], "scores": []})
            entry["rows"].append(r)
            entry["scores"].append(by_index.get(r["index"], {"reward": float("nan")}))
    return out


def _stored(store: RolloutStore) -> list[int]:
    return sorted(set(store.steps("rollouts")) & set(store.steps("scores")))


def line_up_steps(rl_a: Path, rl_b: Path, step: int) -> list[tuple[dict, dict | None]]:
    """(A's samples, B's samples of the same prompt, nearest step first) for each prompt A
    sampled at `step`; B's side is None when B never sampled that prompt."""
    a, b = RolloutStore(rl_a), RolloutStore(rl_b)
    if step - 1 not in _stored(a):
        have = [s + 1 for s in _stored(a)]
        raise CheckpointError(f"{rl_a}: step {step} has no stored rollouts and scores (stored steps: "
                              f"{f'{have[0]}..{have[-1]}' if have else 'none'})")
    mine = _samples(a, step - 1)
    theirs: dict[str, dict] = {}
    for shard in sorted(_stored(b), key=lambda s: (abs(s - (step - 1)), s)):  # nearest step first
        missing = set(mine) - set(theirs)
        if not missing:
            break
        for h, entry in _samples(b, shard, missing).items():
            theirs.setdefault(h, entry)
    return [(mine[h], theirs.get(h)) for h in mine]


def eval_step(rl_dir: Path, step: int | None) -> int:
    """`step` when the run evaluated then, else its last evaluation."""
    stored = sorted(int(p.stem.split("-")[1]) for p in (RLDir(rl_dir).path / "evals").glob("step-*.json"))
    if not stored:
        raise CheckpointError(f"{rl_dir}: no stored evaluation answers (rl/evals/)")
    if step is None:
        return stored[-1]
    if step not in stored:
        raise CheckpointError(f"{rl_dir}: no evaluation after step {step} (evaluated after steps {stored})")
    return step


def line_up_evals(rl_a: Path, rl_b: Path, step: int) -> list[tuple[dict, dict | None]]:
    """(A's answer, B's answer to the same prompt) for each eval prompt of A after `step`."""
    def answers(rl_dir: Path) -> dict[str, dict]:
        data = json.loads(RLDir(rl_dir).eval_answers(step).read_text())
        return {prompt_hash(a["prompt"]): a for a in data["answers"]}

    mine, theirs = answers(rl_a), answers(rl_b)
    return [(mine[h], theirs.get(h)) for h in mine]


def render_steps(names: tuple[str, str], step: int, pairs: list[tuple[dict, dict | None]], decoders) -> str:
    """A table: each prompt, then each run's samples with their rewards and token shading."""
    body = []
    for mine, theirs in pairs:
        cells = []
        for entry, decode in ((mine, decoders[0]), (theirs, decoders[1])):
            if entry is None:
                cells.append('<td class="side missing">not sampled by this run</td>')
                continue
            cells.append(f'<td class="side" data-step="{entry["step"]}"><small>step {entry["step"]}</small>'
                         + group_table(entry["rows"], entry["scores"], {}, decode, "k3") + "</td>")
        body.append(f'<tr class="prompt-row" data-prompt-hash="{prompt_hash(str(mine["prompt"]))}"><td class="prompt">'
                    f'{html.escape(str(mine["prompt"]))}</td>{"".join(cells)}</tr>')
    head = "".join(f"<th>{html.escape(n)}</th>" for n in names)
    return page(f"{names[0]} vs {names[1]}: RL step {step}, prompt by prompt",
                f"<p>{len(pairs)} prompts of step {step}; {sum(t is not None for _, t in pairs)} also sampled by "
                f"{html.escape(names[1])}.</p><table class='compare'><tr><th>prompt</th>{head}</tr>"
                + "".join(body) + "</table>")


def render_evals(names: tuple[str, str], step: int, pairs: list[tuple[dict, dict | None]]) -> str:
    """Each eval prompt and both runs' greedy answers, marked right or wrong."""
    def cell(a: dict | None) -> str:
        if a is None:
            return '<td class="side missing">-</td>'
        return (f'<td class="side answer {"good" if a["correct"] else "bad"}" data-correct="{int(bool(a["correct"]))}">'
                f'{html.escape(str(a["answer"]))}</td>')

    correct = [sum(1 for p in pairs if p[k] is not None and p[k]["correct"]) for k in (0, 1)]
    head = "".join(f"<th>{html.escape(n)}<br><small>{c}/{len(pairs)} correct</small></th>" for n, c in zip(names, correct))
    body = "".join(f'<tr class="prompt-row" data-prompt-hash="{prompt_hash(a["prompt"])}"><td class="prompt">'
                   f'{html.escape(a["prompt"])}</td>{cell(a)}{cell(b)}</tr>' for a, b in pairs)
    return page(f"{names[0]} vs {names[1]}: evaluation after step {step}, prompt by prompt",
                f"<table class='compare'><tr><th>prompt</th>{head}</tr>{body}</table>")
