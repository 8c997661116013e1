"""`rl.learner.micro_batch_tokens: auto`: the micro-batch budget fitted to a memory cap.

A few probe forwards and backwards of the policy on rows of the width to fit (the logits over a
completion of that width included, as the update computes them) measure the peak memory each
adds; a line through (tokens, peak) gives what a micro-batch of any size would add. The budget
is the most whole rows whose peak, on top of what the process holds now and what the first
optimizer step will add (gradients, Adam's two moments), stays under `headroom` of the cap.

Peaks are measured where the memory is: on a GPU by the allocator's own statistics, on a CPU by
the process's resident high-water mark (reset through /proc/self/clear_refs, with freed heap
returned to the system first), the figure a cgroup's limit is enforced on. The fit is a
`BudgetFit`, kept in the checkpoint's manifest: a resumed run reuses it, so its micro-batches,
and so its result, are those of the run it continues.
"""
from __future__ import annotations

import ctypes
import gc
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from hindsight.errors import ConfigError
from hindsight.maths.logprobs import micro_logprobs, model_device

HEADROOM = 0.9          # the share of the cap a step may reach: allocator slack and what the probes miss
PROBE_ROWS = (1, 2, 4)  # rows per probe micro-batch: two or three points for the line
GROWTH = 1.25           # a step whose widest row is this much wider than the fit's is fitted again


@dataclass(frozen=True)
class BudgetFit:
    budget: int           # padded tokens per micro-batch (whole rows of `width`)
    width: int            # the row width (prompt + completion) it was fitted at
    cap_bytes: int
    per_token_bytes: float
    fixed_bytes: float    # the line's intercept: what a micro-batch costs whatever its size

    def outgrown(self, width: int) -> bool:
        """Rows this much wider cost more a token (attention grows with the width): fit again."""
        return width > self.width * GROWTH

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "BudgetFit":
        return cls(**d)


# --- the cap --------------------------------------------------------------------------------
def cgroup_limit() -> int | None:
    """This process's cgroup memory limit in bytes (v2, then v1); None when unlimited."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:  # v1 writes "unlimited" as a page-rounded 2**63
            return int(text)
    return None


def machine_memory() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise ConfigError("rl.learner.micro_batch_tokens: auto: /proc/meminfo has no MemTotal; set rl.learner.memory_cap_mb")


def memory_cap(device: torch.device, configured_mb: float | None) -> int:
    """The bytes a learner may use: the configured cap, else the GPU's memory, else the cgroup's
    limit, else the machine's memory."""
    if configured_mb is not None:
        return int(configured_mb * 2**20)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[1]
    return cgroup_limit() or machine_memory()


# --- measuring a peak -------------------------------------------------------------------------
def _status_bytes(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    raise ConfigError(f"/proc/self/status has no {key}: set rl.learner.micro_batch_tokens to a number")


def held_bytes(device: torch.device) -> int:
    """What the process holds now: the allocator's tensors on a GPU, the resident set on a CPU."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    return _status_bytes("VmRSS:")


def _release() -> None:
    gc.collect()
    try:  # freed heap back to the system, so a probe's pages are counted and not silently reused
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the fit is more conservative, never less
        pass


def measure_peak(device: torch.device, run) -> int:
    """The peak bytes `run()` adds on top of what the process held when it began."""
    _release()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        run()
        return torch.cuda.max_memory_allocated(device) - start
    start = _status_bytes("VmRSS:")
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark restarts at the resident set
    run()
    return _status_bytes("VmHWM:") - start


# --- the maths (pure) ---------------------------------------------------------------------------
def fit_line(points: list[tuple[int, int]]) -> tuple[float, float]:
    """(intercept, slope) of peak bytes against tokens: the least-squares slope, the intercept
    raised until the line is on or above every probe, so it never predicts less than a probe
    measured. A falling line (the allocator reused pages) is replaced by the steepest ratio
    through the origin."""
    n = len(points)
    mx, my = sum(t for t, _ in points) / n, sum(b for _, b in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    slope = sum((t - mx) * (b - my) for t, b in points) / var if var else 0.0
    if slope <= 0:
        return 0.0, max(b / t for t, b in points)
    return max(0.0, max(b - slope * t for t, b in points)), slope


def rows_that_fit(free_bytes: float, intercept: float, slope: float, width: int) -> int:
    """Whole rows of `width` tokens whose micro-batch peak stays within `free_bytes`."""
    return int((free_bytes - intercept) // (slope * width)) if slope > 0 else 1 << 30


def pending_bytes(*pairs) -> int:
    """What the first optimizer step will add to the process: a gradient for every trainable
    parameter that has none yet, and Adam's two moments where the optimizer holds no state."""
    total = 0
    for model, optimizer in pairs:
        if model is None:
            continue
        for p in model.parameters():
            if not p.requires_grad:
                continue
            local = p.to_local() if hasattr(p, "to_local") else p  # a sharded parameter: this rank's shard
            size = local.numel() * local.element_size()
            total += size * (p.grad is None) + 2 * size * (p not in optimizer.state)
    return total


# --- the probe ----------------------------------------------------------------------------------
def _probe_rows(model, rows: int, prompt: int, completion: int, seed: int) -> None:
    """A forward and backward of `rows` rows of random ids: what a micro-batch of them costs."""
    device, vocab = model_device(model), model.get_input_embeddings().num_embeddings
    gen = torch.Generator().manual_seed(seed)  # the run's own generators are not touched
    ids = torch.randint(vocab, (rows, prompt + completion), generator=gen).to(device)  # (R, P+C)
    mask = torch.ones_like(ids)                                                         # (R, P+C)
    logp, entropy = micro_logprobs(model, ids, mask, completion, 1, with_entropy=True)  # (R, C) each
    (logp.sum() + entropy.sum()).backward()


def _probe(model, device, prompt: int, completion: int, most_rows: int) -> list[tuple[int, int]]:
    """(tokens, peak bytes) of each probe that fitted: a probe that runs out of memory ends the
    probing (the line is drawn through those before it; none: no row fits)."""
    from hindsight.learning.oom import is_out_of_memory

    from hindsight.progress import Ticker

    points, sizes = [], [r for r in PROBE_ROWS if r <= max(most_rows, 2)]
    try:
        with Ticker("auto budget", len(sizes), "probes") as ticker:  # a 7B model's probe takes a while
            _probe_rows(model, 1, prompt, completion, seed=0)  # gradients allocated before anything is measured
            for rows in sizes:
                peak = measure_peak(device, lambda n=rows: _probe_rows(model, n, prompt, completion, seed=n))
                points.append((rows * (prompt + completion), peak))
                ticker.update(len(points))
    except Exception as exc:  # noqa: BLE001  (only running out of memory ends the probing; the rest re-raise)
        if not is_out_of_memory(exc):
            raise
        model.zero_grad(set_to_none=True)
    return points


def fit_budget(model, optimizer, prompt: int, completion: int, cap: int, most_rows: int,
               extra=()) -> BudgetFit:
    """Probe the policy at rows of `prompt + completion` tokens and fit the budget under `cap`.
    `extra`: other (model, optimizer) pairs the process holds (a critic), counted as pending;
    `most_rows`: a mini-batch's rows, beyond which a budget buys nothing."""
    device, width = model_device(model), prompt + completion
    was_training = model.training
    model.train()
    try:
        points = _probe(model, device, prompt, completion, most_rows)
    finally:
        optimizer.zero_grad(set_to_none=True)
        model.train(was_training)
    if not points:
        raise ConfigError(f"rl.learner.micro_batch_tokens: auto: a forward and backward of one row of {width} tokens "
                          f"ran out of memory: shorten rl.rollout.max_new_tokens or the prompts, or use "
                          f"model.gradient_checkpointing")
    intercept, slope = fit_line(points)
    _release()
    free = HEADROOM * cap - held_bytes(device) - pending_bytes((model, optimizer), *extra)
    rows = rows_that_fit(free, intercept, slope, width)
    if rows < 1:
        raise ConfigError(f"rl.learner.micro_batch_tokens: auto: one row of {width} tokens needs "
                          f"{(intercept + slope * width) / 2**20:.0f} MiB at its peak, and the cap of {cap / 2**20:.0f} "
                          f"MiB leaves {max(free, 0) / 2**20:.0f} MiB (the process holds {held_bytes(device) / 2**20:.0f}"
                          f" MiB): raise rl.learner.memory_cap_mb, shorten rl.rollout.max_new_tokens, or use "
                          f"model.gradient_checkpointing")
    return BudgetFit(budget=min(rows, most_rows) * width, width=width, cap_bytes=cap, per_token_bytes=slope,
                     fixed_bytes=intercept)
