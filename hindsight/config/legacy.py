"""Keys that moved into the blocks by role (`rl.learner`, `rl.scoring`): the old spelling is
accepted for one release, with one deprecation line per key, in a config file, a `--set` and a
sweep's params alike. Giving a key both ways is an error: which one was meant cannot be known."""
from __future__ import annotations

import logging

log = logging.getLogger("hindsight")

UNTIL = "hindsight 0.3"

# old path under rl -> new path under rl
MOVED: dict[tuple[str, ...], tuple[str, ...]] = {
    **{(k,): ("learner", k) for k in ("lr", "num_iterations", "mini_batch_size", "micro_batch_tokens",
                                       "max_grad_norm", "entropy_coef", "disable_dropout")},
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
    _move_loss_keys(out)
    return out


# rl.learner.loss_agg named the clipped surrogate's reduction; each is now a registered loss
AGGREGATION_LOSS = {"seq_mean_token_mean": "grpo", "token_mean": "dapo", "seq_mean_token_sum_norm": "dr_grpo"}
CLIP_KEYS = ("clip_eps_low", "clip_eps_high", "clip_ratio_c")


def _move_loss_keys(rl: dict) -> None:
    """rl.[learner.]loss_agg -> rl.learner.loss; rl.[learner.]clip_* -> the loss's block; async's
    TIS -> rl.learner.correction (token level, truncated at is_cap). In place, on `move_deprecated`'s copy."""
    learner = rl.get("learner", {})
    if not isinstance(learner, dict):
        return  # a malformed block: its own validation names it
    learner, spelt = dict(learner), {}  # spelt: how the user wrote a key, for its deprecation line
    for key in ("loss_agg", *CLIP_KEYS):  # the spelling under rl itself first goes where rl.learner's would
        if key in rl:
            if key in learner:
                raise ValueError(f"rl.{key} and rl.learner.{key} are both set: keep one")
            learner[key], spelt[key] = rl.pop(key), f"rl.{key}"
    if "loss_agg" in learner:
        agg = learner.pop("loss_agg")
        if "loss" in learner:
            raise ValueError(f"{spelt.get('loss_agg', 'rl.learner.loss_agg')} and rl.learner.loss are both set: keep "
                             f"rl.learner.loss (the other is its deprecated spelling)")
        learner["loss"] = AGGREGATION_LOSS.get(agg, agg)
        log.warning("%s is deprecated: write rl.learner.loss: %s (the old key is accepted until %s)",
                    spelt.get("loss_agg", "rl.learner.loss_agg"), learner["loss"], UNTIL)
    loss = learner.get("loss", "grpo")
    for key in [k for k in CLIP_KEYS if k in learner]:
        block = learner.get(loss) or {}
        if not isinstance(block, dict):
            break  # a malformed block: its own validation names it
        block = learner[loss] = dict(block)
        if key in block:
            raise ValueError(f"rl.learner.{key} and rl.learner.{loss}.{key} are both set: keep rl.learner.{loss}.{key}")
        log.warning("%s is deprecated: write rl.learner.%s.%s (the old key is accepted until %s)",
                    spelt.get(key, f"rl.learner.{key}"), loss, key, UNTIL)
        block[key] = learner.pop(key)
    if learner or "learner" in rl:
        rl["learner"] = learner
    sync = rl.get("async")
    if isinstance(sync, dict) and ("is_correction" in sync or "is_cap" in sync):
        sync = rl["async"] = dict(sync)
        tis, cap = sync.pop("is_correction", "none"), sync.pop("is_cap", 2.0)
        if "correction" in learner:
            raise ValueError("rl.async.is_correction and rl.learner.correction are both set: keep "
                             "rl.learner.correction")
        _warn(("async", "is_correction"), ("learner", "correction"))
        rl["learner"] = {**learner, "correction": ({"level": "token", "action": "truncate", "clip_max": cap}
                                                   if tis == "tis" else {"level": "none"})}
