"""Keys that moved into the blocks by role (`rl.learner`, `rl.scoring`): the old spelling is
accepted for one release, with one deprecation line per key, in a config file, a `--set` and a
sweep's params alike. Giving a key both ways is an error: which one was meant cannot be known."""
from __future__ import annotations

import logging

log = logging.getLogger("hindsight")

UNTIL = "hindsight 0.3"

# old path under rl -> new path under rl
MOVED: dict[tuple[str, ...], tuple[str, ...]] = {
    **{(k,): ("learner", k) for k in ("lr", "clip_eps_low", "clip_eps_high", "clip_ratio_c", "loss_agg",
                                       "num_iterations", "mini_batch_size", "micro_batch_tokens", "max_grad_norm",
                                       "entropy_coef", "disable_dropout")},
    ("workers", "learner"): ("learner", "processes"),
    ("workers", "learner_strategy"): ("learner", "strategy"),
    ("workers", "learner_offload"): ("learner", "offload"),
    ("workers", "publish_bucket_mb"): ("learner", "publish_bucket_mb"),
    ("rewards",): ("scoring", "rewards"),
    ("reward_model_weight",): ("scoring", "reward_model_weight"),
    ("reward_fallback",): ("scoring", "fallback"),
    ("reward_failure_stop",): ("scoring", "failure_stop"),
    ("reward_timeout_s",): ("scoring", "timeout_s"),
    ("reward_isolation",): ("scoring", "isolation"),
}


def _dotted(path: tuple[str, ...]) -> str:
    return ".".join(("rl", *path))


def _warn(old: tuple[str, ...], new: tuple[str, ...]) -> None:
    log.warning("%s is deprecated: write %s (the old key is accepted until %s)", _dotted(old), _dotted(new), UNTIL)


def current_path(dotted: str) -> str:
    """A `--set` or sweep key in today's spelling (`rl.lr` -> `rl.learner.lr`), said once."""
    parts = tuple(dotted.split("."))
    if parts[:1] != ("rl",):
        return dotted
    for old, new in MOVED.items():
        if parts[1:1 + len(old)] == old:
            _warn(old, new)
            return ".".join(("rl", *new, *parts[1 + len(old):]))
    return dotted


def as_written(loc: tuple, written) -> tuple:
    """An error's location as the file spells it: a deprecated key that was moved into its block
    is named the way the user wrote it (`written(loc)`: whether the file holds that key path)."""
    if len(loc) < 2 or loc[0] != "rl" or written(loc):
        return loc
    for old, new in MOVED.items():
        if tuple(loc[1:1 + len(new)]) == new:
            spelled = ("rl", *old, *loc[1 + len(new):])
            if written(spelled):
                return spelled
    return loc


def move_deprecated(rl: dict) -> dict:
    """The `rl` mapping with every old key moved to its block (a copy; the input is not changed)."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in rl.items()}
    for old, new in MOVED.items():
        parent = out if len(old) == 1 else out.get(old[0])
        if not isinstance(parent, dict) or old[-1] not in parent:
            continue
        block = out.get(new[0])
        if block is None:
            block = out[new[0]] = {}
        if not isinstance(block, dict):
            continue  # a malformed block: its own validation names it
        if new[1] in block:
            raise ValueError(f"{_dotted(old)} and {_dotted(new)} are both set: keep {_dotted(new)} (the other is "
                             f"its deprecated spelling)")
        _warn(old, new)
        block[new[1]] = parent.pop(old[-1])
    return out
