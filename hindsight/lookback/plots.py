"""PNG plots of an RL run from its metric history and stored shards (matplotlib, no display)."""
from __future__ import annotations

import io
from pathlib import Path

from hindsight.fsutil import atomic_write_bytes
from hindsight.lookback.history import as_float


def _figure():
    import matplotlib

    matplotlib.use("Agg")  # no display on a server or in CI
    import matplotlib.pyplot as plt

    return plt, plt.subplots(figsize=(7, 4), dpi=100)


def _png(plt, fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def reward_band(history: list[dict]) -> tuple[list, list, list, list]:
    """(steps, mean, lower, upper): mean ± std, clipped to each step's observed min..max."""
    out = ([], [], [], [])
    for h in history:
        if "reward/mean" not in h:
            continue
        m, s = as_float(h["reward/mean"]), as_float(h.get("reward/std", 0.0))
        lo, hi = as_float(h.get("reward/min", m - s)), as_float(h.get("reward/max", m + s))
        for column, value in zip(out, (h["step"], m, max(m - s, lo), min(m + s, hi))):
            column.append(value)
    return out


def reward_curve(history: list[dict], title: str = "reward and accuracy") -> bytes:
    """Mean reward with a one-std band per step (clipped to the step's reward range: a reward in
    [0, 1] never shows a band below 0), and held-out accuracy on its own axis; the legend sits
    under the plot, where it covers no curve."""
    plt, (fig, ax) = _figure()
    steps, mean, lower, upper = reward_band(history)
    if steps:
        ax.plot(steps, mean, color="#0969da", label="reward/mean")
        ax.fill_between(steps, lower, upper, color="#0969da", alpha=0.15, label="± std (within min..max)")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    acc = [(h["step"], as_float(h["eval/accuracy"])) for h in history if "eval/accuracy" in h]
    handles, labels = ax.get_legend_handles_labels()
    if acc:
        ax2 = ax.twinx()
        ax2.plot(*zip(*acc), "o-", color="#1a7f37", label="eval/accuracy")
        ax2.set_ylabel("eval/accuracy")
        ax2.set_ylim(-0.02, 1.02)
        more = ax2.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    if handles:
        ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3, frameon=False)
    ax.set_title(title)
    return _png(plt, fig)


def histogram(values: list[float], xlabel: str, title: str, bins: int = 20) -> bytes:
    plt, (fig, ax) = _figure()
    ax.hist(values, bins=bins, color="#8250df", edgecolor="white")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("completions")
    ax.set_title(title)
    return _png(plt, fig)


def curves(series: dict[str, list[tuple[int, float]]], ylabel: str, title: str) -> bytes:
    """One line per named series (a sweep's trials)."""
    plt, (fig, ax) = _figure()
    for name, pts in series.items():
        if pts:
            ax.plot(*zip(*pts), label=name)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if series:
        ax.legend(fontsize=7, loc="best")
    return _png(plt, fig)


def write_run_plots(out_dir: Path, history: list[dict], rewards: list[float], lengths: list[int], step: int) -> list[Path]:
    """The run's three standard plots; returns the files written."""
    files = {
        "reward_curve.png": reward_curve(history),
        "reward_hist.png": histogram(rewards, "reward", f"reward distribution at step {step}"),
        "length_hist.png": histogram([float(n) for n in lengths], "completion tokens",
                                     f"response length at step {step}", bins=max(5, min(30, max(lengths, default=1)))),
    }
    paths = []
    for name, data in files.items():
        atomic_write_bytes(Path(out_dir) / name, data)
        paths.append(Path(out_dir) / name)
    return paths
