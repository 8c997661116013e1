"""Self-contained HTML rollout reports: what the model wrote, and where it was unsure.

One file, inline CSS, no script and no network: it opens from an MLflow artifact or a run
directory on a machine with no internet. Each completion token is a `<span class="tok">`
shaded by its probability under the policy that sampled it, with the log-prob, the
reference log-prob and the per-token KL in data attributes and the hover title.
"""
from __future__ import annotations

import html
import json
import math
import numbers
import time

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#1f2328;max-width:1200px}
h1{font-size:20px}h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #d0d7de;padding:4px 8px;vertical-align:top}
th{background:#f6f8fa;text-align:left}.prompt{white-space:pre-wrap;font-family:ui-monospace,monospace;color:#57606a}
.completion{font-family:ui-monospace,monospace;white-space:pre-wrap}
.tok{border-radius:2px;padding:0 1px;margin:0 0.5px}.tok:hover{outline:1px solid #0969da}
.legend span{display:inline-block;width:60px;text-align:center;font-size:12px}
.good{color:#1a7f37;font-weight:600}.bad{color:#cf222e}.num{text-align:right;font-variant-numeric:tabular-nums}
.turn{margin:2px 0;padding:2px 4px}.env-turn{background:#f6f8fa;border-left:3px solid #8c959f;color:#57606a}
"""

SUMMARY_KEYS = ("reward/mean", "reward/std", "reward/zero_std_fraction", "policy/kl", "policy/entropy", "response_length/mean",
                "response_length/truncated_fraction", "policy/clip_fraction", "policy/approx_kl", "policy/grad_norm",
                "rollout/completion_rate", "runtime/rollout/tokens_per_s", "eval/accuracy", "multiturn/turns",
                "multiturn/tool_calls", "multiturn/tool_error_rate", "multiturn/cut_by_turns",
                "multiturn/retokenize_mismatches")


def _num(v) -> float:
    """A stored number, or NaN for anything else: a crafted shard cannot break the page."""
    return float(v) if isinstance(v, numbers.Real) else math.nan


def _attr(v) -> str:
    """Any value as an attribute's text, quotes escaped."""
    return html.escape(str(v), quote=True)


def shade(logprob: float) -> str:
    """Background for a token: clear when the policy was sure (p near 1), red as p falls."""
    alpha = 1.0 - math.exp(max(logprob, -50.0))
    return f"rgba(207,34,46,{alpha * 0.85:.3f})"


def token_kl(logprob: float, ref_logprob: float, estimator: str = "k3") -> float:
    """Per-token KL(pi || ref) with the run's own estimator (`rl.kl.estimator`), as the loss saw it."""
    import torch

    from hindsight.learning.terms import kl_estimate

    return float(kl_estimate(torch.tensor([[logprob]]), torch.tensor([[ref_logprob]]), estimator))


def token_spans(ids: list[int], logprobs: list[float], ref_logprobs: list[float] | None, decode,
                kl_estimator: str = "k3") -> str:
    """One span per completion token; `decode(id)` gives the token's text."""
    out = []
    for k, (tid, lp) in enumerate(zip(ids, logprobs)):
        try:
            text = decode(tid)
        except Exception:  # an id the tokenizer does not know (a crafted or foreign shard)
            text = f"<id {tid}>"
        lp = _num(lp)
        shown = html.escape(text.replace("\n", "⏎\n")) or "&#9251;"
        attrs = f'data-logprob="{lp:.4f}"'
        title = f"logprob {lp:.3f} (p={math.exp(lp):.3f})"
        if ref_logprobs is not None and k < len(ref_logprobs):
            ref = _num(ref_logprobs[k])
            kl = token_kl(lp, ref, kl_estimator)
            attrs += f' data-ref-logprob="{ref:.4f}" data-kl="{kl:.4f}"'
            title += f" | ref {ref:.3f} | KL ({kl_estimator}) {kl:.4f}"
        out.append(f'<span class="tok" {attrs} title="{html.escape(title)}" '
                   f'style="background:{shade(lp)}">{shown}</span>')
    return "".join(out)


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}" if math.isfinite(v) else str(v)
    return html.escape(str(v))


def group_table(rows: list[dict], scores: list[dict], advantages: dict[int, float], decode, kl_estimator: str) -> str:
    fns = [k for k in scores[0] if k.startswith("reward_")]
    has_rm = any(s.get("rm_score") is not None for s in scores)
    head = "".join(f"<th>{html.escape(k.removeprefix('reward_'))}</th>" for k in fns)
    head += "<th>reward model</th>" if has_rm else ""
    body = []
    for r, s in zip(rows, scores):
        cells = "".join(f'<td class="num reward-fn" data-fn="{html.escape(k.removeprefix("reward_"))}">'
                        f'{_fmt(s[k])}</td>' for k in fns)
        cells += f'<td class="num reward-rm">{_fmt(s.get("rm_score"))}</td>' if has_rm else ""
        adv = advantages.get(r["index"])
        spans = (_turns(r, s.get("ref_logprobs"), decode, kl_estimator) if r.get("turns")
                 else token_spans(r["completion_ids"], r["logprobs"], s.get("ref_logprobs"), decode, kl_estimator))
        eos = "" if r["ended_with_eos"] else ' <span class="bad" title="no EOS">(truncated)</span>'
        body.append(f'<tr class="completion-row" data-index="{_attr(r["index"])}"><td class="completion">{spans}{eos}'
                    f'</td><td class="num reward" data-reward="{_num(s["reward"]):.6g}">{_fmt(s["reward"])}</td>{cells}'
                    f'<td class="num advantage">{_fmt(adv)}</td></tr>')
    return (f"<table><tr><th>completion (hover a token)</th><th>reward</th>{head}<th>advantage</th></tr>"
            + "".join(body) + "</table>")


def _turns(r: dict, ref, decode, kl_estimator: str) -> str:
    """A multi-turn trajectory, a turn at a time: the model's turns as shaded tokens (what was
    sampled and trained), each tool or environment turn as what was called and what came back,
    unshaded (context the policy read, never trained on)."""
    out = []
    for turn in json.loads(r["turns"]):
        a, b = int(turn["start"]), int(turn["end"])
        if turn["role"] == "assistant":
            spans = token_spans(r["completion_ids"][a:b], r["logprobs"][a:b], ref[a:b] if ref is not None else None,
                                decode, kl_estimator)
            out.append(f'<div class="turn model-turn" data-span="{a}:{b}">{spans}</div>')
            continue
        calls = "".join(f'<div class="call{" bad" if c.get("error") else ""}" data-tool="{_attr(c.get("tool"))}">'
                        f'{html.escape(str(c.get("tool")))}({html.escape(json.dumps(c.get("arguments"))[:500])}) '
                        f'&rarr; {html.escape(str(c.get("result"))[:1000])} <small>{_num(c.get("seconds")):.3f} s</small>'
                        f'</div>' for c in turn.get("calls", []))
        body = calls or html.escape(str(turn.get("text", ""))[:1000])
        out.append(f'<div class="turn env-turn" data-role="{_attr(turn["role"])}" data-span="{a}:{b}">{body}</div>')
    cut = f' <span class="bad">(cut by the {html.escape(r["cut"])} limit)</span>' if r.get("cut") else ""
    return "".join(out) + cut


def render_step_report(run_name: str, step: int, rows: list[dict], scores: list[dict], advantages: dict[int, float],
                       metrics: dict, decode, max_groups: int = 4, kl_estimator: str = "k3") -> str:
    """The report for RL step `step` (1-based, as in MLflow): its rollouts, rewards and advantages."""
    groups: dict[int, list[int]] = {}
    for j, r in enumerate(rows):
        groups.setdefault(r["group"], []).append(j)
    sections = []
    for g in sorted(groups)[:max_groups]:
        idx = groups[g]
        first = rows[idx[0]]
        replay = " (replayed hard example)" if first.get("replayed") else ""
        sections.append(f'<section class="group" data-group="{_attr(g)}"><h2>prompt {html.escape(str(first["prompt_id"]))}'
                        f'{replay}</h2><div class="prompt">{html.escape(str(first["prompt"]))}</div>'
                        + group_table([rows[j] for j in idx], [scores[j] for j in idx], advantages, decode,
                                       kl_estimator)
                        + "</section>")
    summary = "".join(f"<tr><th>{html.escape(k)}</th><td class='num metric' data-metric='{html.escape(k)}'>"
                      f"{_fmt(metrics[k])}</td></tr>" for k in SUMMARY_KEYS if k in metrics)
    legend = "".join(f'<span style="background:{shade(math.log(p))}">p={p}</span>' for p in (1.0, 0.75, 0.5, 0.25, 0.05))
    return page(f"{run_name}: RL step {step}",
                 f"<p>{len(rows)} completions in {len(groups)} groups; showing {min(len(groups), max_groups)}. "
                 f"Generated {time.strftime('%Y-%m-%d %H:%M:%S')}.</p>"
                 f"<h2>step metrics</h2><table class='summary'>{summary}</table>"
                 f"<p class='legend'>token shading: {legend}</p>" + "".join(sections))


def render_versions_report(run_name: str, prompts: list[str], answers: dict[str, list[tuple[str, bool]]]) -> str:
    """Fixed eval prompts answered by each policy version, side by side, with correctness."""
    labels = list(answers)
    head = "".join(f"<th>{html.escape(v)}<br><small>{sum(c for _, c in answers[v])}/{len(prompts)} correct"
                   f"</small></th>" for v in labels)
    body = []
    for i, p in enumerate(prompts):
        cells = "".join(f'<td class="answer {"good" if answers[v][i][1] else "bad"}" data-version="{html.escape(v)}" '
                        f'data-correct="{int(answers[v][i][1])}">{html.escape(answers[v][i][0])}</td>' for v in labels)
        body.append(f'<tr><td class="prompt">{html.escape(p)}</td>{cells}</tr>')
    return page(f"{run_name}: registered policy versions compared",
                 f"<table class='versions'><tr><th>prompt</th>{head}</tr>{''.join(body)}</table>")


def cell(v) -> str:
    """A value as a table cell: 4 significant digits for floats, '-' for missing."""
    if v is None:
        return "-"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def text_table(header: list[str], rows: list[list], max_width: int = 48) -> str:
    """Aligned plain-text columns for the terminal and text artifacts (long cells are cut)."""
    cells = [[cell(v)[:max_width] for v in row] for row in [header, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    fmt = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(cells[0]), fmt(["-" * w for w in widths])] + [fmt(r) for r in cells[1:]])


def page(title: str, body: str) -> str:
    page = (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>{body}</body></html>\n")
    # a lone surrogate (a crafted shard, a broken tokenizer) cannot be written as UTF-8: show it escaped
    return page.encode("utf-8", "backslashreplace").decode("utf-8")
