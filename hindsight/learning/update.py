"""One policy update over a batch of rollouts.

Every algorithm is an advantage estimator (`hindsight.learning.algorithms`) plugged into the same
clipped policy-gradient kernel: advantages first, on the whole batch, then `num_iterations`
passes over its mini-batches (one optimizer step each) of the loss against the behaviour
log-probs stored in the rollout, a micro-batch at a time (`batching`). An algorithm with a
critic (PPO) also trains it on the same mini-batches.
"""
from __future__ import annotations

import math

from dataclasses import dataclass, fields
from functools import partial

import torch

from hindsight.errors import NonFiniteError

from hindsight.learning.algorithms import get_algorithm
from hindsight.learning.algorithms.base import AdvantageInputs, AlgorithmSettings
from hindsight.learning.correction import Correction, gap_metrics
from hindsight.learning.entropy import EntropyControl
from hindsight.learning.losses.objective import Objective, policy_loss
from hindsight.learning.terms import kl_estimate, value_loss
from hindsight.learning.batching import Totals, mini_batches, padded_share, padding_fraction
from hindsight.learning.critic import token_values
from hindsight.learning.oom import split_on_oom
from hindsight.maths.experience import Experience, lengths, micro_batches, trimmed
from hindsight.maths.logprobs import budgeted_logprobs, micro_logprobs, model_device, packs


@dataclass(frozen=True, kw_only=True)
class LearnerSettings:
    algorithm: str = "grpo"
    params: AlgorithmSettings | None = None   # the algorithm's own block (rl.<name>); None: its defaults
    num_iterations: int = 1
    max_grad_norm: float = 1.0
    temperature: float = 1.0
    loss: Objective = Objective()             # the policy loss, its correction, KL and entropy terms
    reward_kl_coef: float = 0.0               # > 0 when `kl.in: reward`
    mask_truncated: bool = False              # completions cut at max_new_tokens are left out of the loss
    entropy: EntropyControl | None = None     # the adaptive coefficient's state (rl.learner.adaptive_entropy)
    mini_batch_size: int | None = None       # samples per optimizer step; None: the whole step
    micro_batch_tokens: int | None = None    # padded tokens per forward/backward; None: the whole mini-batch
    packing: str = "off"                     # off / on / auto: rows end to end in a micro-batch's forwards
    anchor: str = "stored"                   # stored: the batch's log-probs; step: the update's own forward

    @property
    def estimator(self):
        return get_algorithm(self.algorithm)

    @property
    def algorithm_settings(self) -> AlgorithmSettings:
        return self.params if self.params is not None else self.estimator.Settings()


def learner_settings(rl) -> LearnerSettings:
    """The learner's view of a validated `RLConfig`; the one place settings are built.

    Fields named like `rl.learner`'s are taken from it by name; only the derived ones are spelt
    out, so a new learner knob cannot be copied into the wrong slot.
    """
    in_loss, learner = rl.kl.placement == "loss", rl.learner
    loss = Objective(loss=learner.loss, params=learner.loss_settings(), correction=resolved_correction(rl),
                     kl_coef=rl.kl.coef if in_loss else 0.0, kl_estimator=rl.kl.estimator,
                     kl_bias_correction=rl.kl.bias_correction, entropy_coef=learner.entropy_coef,
                     top_entropy_quantile=learner.top_entropy_quantile, max_len=rl.rollout.max_new_tokens)
    budget = learner.micro_batch_tokens
    return _by_name(LearnerSettings, learner, algorithm=rl.algorithm, params=rl.algorithm_settings(),
                    micro_batch_tokens=None if budget == "auto" else budget,  # auto: set by the fit (learning.fit)
                    temperature=rl.rollout.temperature, anchor="step" if rl.rollout.logprobs == "learner" else "stored",
                    loss=loss, reward_kl_coef=0.0 if in_loss else rl.kl.coef,
                    entropy=EntropyControl.of(learner.adaptive_entropy, learner.entropy_coef))


def resolved_correction(rl) -> Correction:
    """`rl.learner.correction` with `auto` decided: on (TRL's sequence mask at 3) where the engine's
    log-probs come from another numeric path than the learner's forward, else off. In an async
    run a correction also covers the staleness: the anchor is the learner's forward at the step's
    start (the stored log-probs are version s - k's)."""
    from hindsight.rollout.engines import get_engine  # the registry only

    c = rl.learner.correction
    level, action, lo, hi = c.level, c.action, c.clip_min, c.clip_max
    if level == "auto":
        level = "sequence" if get_engine(rl.rollout.backend).recomputes(rl.rollout) else "none"
    return Correction(level=level, action=action, clip_min=lo, clip_max=hi, off_policy_mask=c.off_policy_mask,
                      recompute_anchor=level != "none" and rl.async_.max_staleness >= 1)


def _by_name(cls, source, **derived):
    return cls(**{f.name: getattr(source, f.name) for f in fields(cls) if f.name not in derived}, **derived)


def reward_kl(exp: Experience, s: LearnerSettings) -> torch.Tensor | None:
    """(B, T) KL of the behaviour policy from the reference, for the reward penalty."""
    if not s.reward_kl_coef or exp.ref_logprobs is None:
        return None
    return kl_estimate(exp.logprobs, exp.ref_logprobs, s.loss.kl_estimator, exp.loss_mask)


def compute_advantages(exp: Experience, s: LearnerSettings, values: torch.Tensor | None = None):
    """Returns (advantages (B,) or (B, T), returns (B, T) for a critic's targets else None)."""
    weights = exp.meta.get("reward_weights")
    x = AdvantageInputs(rewards=exp.rewards, mask=exp.loss_mask, group_size=exp.group_size,
                        kl=reward_kl(exp, s), kl_coef=s.reward_kl_coef, values=values,
                        reward_parts=exp.reward_parts if weights is not None else None,
                        reward_weights=torch.tensor(weights, dtype=torch.float32) if weights is not None else None)
    return s.estimator.advantages(x, s.algorithm_settings)


class Share:
    """This process's part of the learner group: here one process alone. A learner strategy
    (`learning.strategies`) is a `Share` of its own ranks. Every rank holds the whole batch and
    trains on its groups of each mini-batch; its losses are divided by the whole mini-batch's
    totals, so the sum of the ranks' gradients is the one-process gradient exactly. What the
    strategies differ in is overridden there: how the gradients are summed (`sync`), the loss
    scale that undoes an averaging reduction (`grad_scale`), how many micro-batches a rank runs
    (`most`: every rank the same when each forward is a collective), and how the ranks come to
    hold the same tensor (`agree`)."""
    rank: int = 0
    world: int = 1
    grad_scale: float = 1.0

    def rows(self, group_ids: list[int]) -> tuple[list[int], float]:
        """This rank's rows among a mini-batch's (given by group), and their loss weight."""
        index, override = padded_share(group_ids, self.rank, self.world)
        return index, 1.0 if override is None else override

    def sync(self, params) -> None:
        """Sum the ranks' gradients (nothing to sum alone)."""

    def total(self, stats: dict[str, float]) -> dict[str, float]:
        """Sums over the group (each rank's statistics are its part of the mini-batch's)."""
        if self.world == 1:
            return stats
        import torch.distributed as dist

        keys = sorted(stats)
        flat = torch.tensor([stats[k] for k in keys], dtype=torch.float64)       # (K,)
        dist.all_reduce(flat)
        return dict(zip(keys, flat.tolist()))

    def most(self, n: int) -> int:
        """How many micro-batches this rank runs when it has `n` of its own."""
        return n

    def agree(self, t: torch.Tensor) -> torch.Tensor:
        """`t` as every rank must hold it, when each rank computed it (a critic's values)."""
        return t


def whole_batch_advantages(exp: Experience, s: LearnerSettings, critic=None, share: Share | None = None) -> Experience:
    """Set the batch's advantages (and a critic's values and returns) on `exp`, unless they are
    set: the one place they are computed, always on the whole batch, before any rank takes its
    share, so every rank of the learner group sees the numbers one process would. A critic whose
    forward needs every rank is run by all of them, and their values agreed on (`Share.agree`)."""
    if exp.advantages is not None:
        return exp
    if s.mask_truncated and exp.ended is not None:  # before the advantages: a token-level estimator whitens over the mask
        keep = exp.ended.to(exp.completion_mask.dtype).unsqueeze(1)                          # (B, 1)
        exp.action_mask = keep * (exp.action_mask if exp.action_mask is not None else torch.ones_like(exp.completion_mask))
    if s.estimator.needs_critic and exp.values is None:
        exp.values = (share or Share()).agree(_values(critic, exp, s.micro_batch_tokens, s.packing))  # (B, T)
    exp.advantages, exp.returns = compute_advantages(exp, s, exp.values)
    return exp


def anchored(model, exp: Experience, s: LearnerSettings, share: Share) -> Experience:
    """An async run with the correction on: the ratio's anchor becomes the learner's forward on
    its weights at the step's start, and the stored log-probs (version s - k's, or an engine's
    own) the engine side of the correction, which then corrects the staleness (a decoupled
    objective). Every rank runs the forward on the whole batch (a sharded one is a collective)."""
    if not s.loss.correction.recompute_anchor or exp.meta.get("anchored"):
        return exp
    engine = exp.engine_logprobs if exp.engine_logprobs is not None else exp.logprobs
    was = model.training
    model.eval()
    anchor = share.agree(budgeted_logprobs(model, exp, s.temperature, s.micro_batch_tokens, s.packing))  # (B, T)
    model.train(was)
    exp.logprobs, exp.engine_logprobs = anchor.to(exp.logprobs.dtype) * exp.completion_mask, engine
    exp.meta["anchored"] = True
    return exp


@torch.no_grad()
def _values(critic, exp: Experience, budget: int | None, packing: str = "off") -> torch.Tensor:
    """(B, T) the critic's values before the update, a micro-batch at a time."""
    values = torch.zeros(exp.completion_mask.shape, dtype=exp.logprobs.dtype)     # (B, T)
    for rows in micro_batches(*lengths(exp), exp.group_size, budget):
        part = trimmed(exp, rows).to(model_device(critic))
        v = token_values(critic, part.input_ids, part.attention_mask, part.completion_mask.size(1), packing)  # (b, t)
        values[rows, : v.size(1)] = v.cpu()
    return values


def update(model, optimizer, exp: Experience, s: LearnerSettings, critic=None, critic_optimizer=None,
           share: Share | None = None, health=None) -> dict:
    """Train on one stored batch: `num_iterations` passes over its mini-batches, one optimizer
    step each, gradients accumulated over each mini-batch's micro-batches. Returns the last
    pass's metrics (means over its mini-batches) and every pass's ratio.

    The batch's advantages are computed first if they are not set (`whole_batch_advantages`).
    `share` is this rank's part in the learner group; `health` (`learning.health.Health`), when
    given, stops a diverging step.
    """
    share = share or Share()
    exp = whole_batch_advantages(exp, s, critic, share)
    if s.anchor == "step":  # the stored log-probs are the engine's; the step's forwards fill in the anchor
        exp.engine_logprobs = exp.engine_logprobs if exp.engine_logprobs is not None else exp.logprobs.clone()
        exp.logprobs = exp.logprobs.clone()
    else:
        exp = anchored(model, exp, s, share)
        gap = gap_metrics(exp.logprobs, exp.engine_logprobs, exp.loss_mask, s.loss.correction)  # the whole batch's
    groups = exp.meta.get("groups") or [i // exp.group_size for i in range(len(exp))]
    model.train()
    if critic is not None:
        critic.train()
    metrics: dict[str, float] = {}
    ratios: dict[str, float] = {}
    trained: list[int] = []  # this rank's rows, whose anchors a step-anchored update computed
    for it in range(s.num_iterations):
        steps = []
        for rows in mini_batches(len(exp), exp.group_size, s.mini_batch_size):
            mine, weight = share.rows([groups[i] for i in rows])
            totals = Totals.of(exp.loss_mask[rows])  # the whole mini-batch's, on every rank
            index = [rows[i] for i in mine]
            mb = exp.rows(index)
            steps.append(_mini_batch_step(model, optimizer, critic, critic_optimizer, mb, totals, s, share, weight,
                                          health))
            if s.anchor == "step":
                exp.logprobs[index] = mb.logprobs
                trained += index if weight else []  # weight 0: a stand-in row, another rank's
        metrics = {k: sum(m[k] for m in steps) / len(steps) for k in steps[0]}
        ratios[f"ratio_mean/iter{it}"] = metrics["ratio_mean"]
    if s.anchor == "step":  # the gap over the rows this rank trained (on a learner group, its share)
        mine = sorted(set(trained))
        gap = gap_metrics(exp.logprobs[mine], exp.engine_logprobs[mine], exp.loss_mask[mine], s.loss.correction)
    return {**metrics, **ratios, **gap, "learn/mini_batches": float(len(steps))}


def _mini_batch_step(model, optimizer, critic, critic_optimizer, mb: Experience, totals: Totals, s: LearnerSettings,
                     share: Share, weight: float, health) -> dict:
    """The policy's optimizer step on a mini-batch (this rank's rows), then the critic's, each in
    micro-batches of `s.micro_batch_tokens`, each redone in smaller ones after an out-of-memory
    error (`learning.oom`)."""
    scale = weight * share.grad_scale
    widths = [p + c for p, c in zip(*lengths(mb))]
    cut = partial(_cut, mb)
    step, redone = split_on_oom(partial(_policy_parts, model, optimizer, mb, totals, s, share, scale, weight, health),
                                cut, s.micro_batch_tokens, widths, share.world,
                                lambda: optimizer.zero_grad(set_to_none=True))
    if critic is not None:
        more, again = split_on_oom(partial(_critic_parts, critic, critic_optimizer, mb, totals, s, share, scale, weight),
                                   cut, s.micro_batch_tokens, widths, share.world,
                                   lambda: critic_optimizer.zero_grad(set_to_none=True))
        step, redone = {**step, **more}, redone + again
    return {**step, "learn/oom_retries": float(redone)}


def _cut(mb: Experience, budget: int | None) -> list[list[int]]:
    return micro_batches(*lengths(mb), mb.group_size, budget)


def _policy_parts(model, optimizer, mb, totals, s, share, scale, weight, health, parts) -> dict:
    idle = share.most(len(parts)) - len(parts)  # zero-weighted micro-batches that join the collectives
    return {**_policy_step(model, optimizer, mb, parts, totals, s, share, scale, weight, idle, health),
            "learn/padding_fraction": padding_fraction(mb, parts), "learn/micro_batches": float(len(parts))}


def _critic_parts(critic, optimizer, mb, totals, s, share, scale, weight, parts) -> dict:
    idle = share.most(len(parts)) - len(parts)
    return _critic_step(critic, optimizer, mb, parts, totals, s, share, scale, weight, idle)


def _policy_step(model, optimizer, mb: Experience, parts: list[list[int]], totals: Totals, s: LearnerSettings,
                 share: Share, scale: float, weight: float, idle: int = 0, health=None) -> dict:
    """One optimizer step on a mini-batch (this rank's rows of it), a micro-batch at a time.
    `weight` is 0 for a rank's stand-in row, and so are `idle` extra micro-batches of a rank with
    fewer than the others whose forwards are collectives: they join them and count for nothing."""
    optimizer.zero_grad(set_to_none=True)
    dev, sums, n_packed = model_device(model), {}, 0
    coef = s.entropy.applied() if s.entropy is not None else s.loss.entropy_coef
    for rows, w_loss, w_stats in _with_idle(parts, idle, scale, weight):
        part = trimmed(mb, rows).to(dev)
        mask = part.loss_mask                                                     # (b, t) what the policy sampled
        packed = packs(model, part.attention_mask, mask.size(1), part.group_size, s.packing, part.input_ids)
        n_packed += packed
        logp, entropy = micro_logprobs(model, part.input_ids, part.attention_mask, mask.size(1), part.group_size,
                                       s.temperature, with_entropy=True, entropy_grad=bool(coef),
                                       packing="on" if packed else "off")  # (b, t), (b, t)
        old = part.logprobs                                                       # (b, t) the ratio's anchor
        if s.anchor == "step":  # one optimizer step a batch: this forward is the behaviour policy's
            old = logp.detach()
            mb.logprobs[rows, :old.size(1)] = old.to(mb.logprobs.device, mb.logprobs.dtype)
        loss, stats = policy_loss(logp, old, part.ref_logprobs, part.advantages, mask, s.loss, entropy,
                                  totals, part.engine_logprobs, coef)
        (loss * w_loss).backward()
        m = mask.to(logp.dtype)
        n = float(m.sum()) * w_stats  # the micro-batch's statistics are token means: back to sums
        _add(sums, {"loss": float(loss.detach()) * w_stats, "entropy": float((entropy.detach() * m).sum()) * w_stats,
                    **{k: v * n for k, v in stats.items()}})
    share.sync(model.parameters())
    grad_norm = _clip(model, s.max_grad_norm)
    sums = share.total(sums)  # the mini-batch's, over the learner group
    refuse_non_finite("policy", sums["loss"], grad_norm, optimizer)
    if health is not None:
        _healthy(health.before_step, optimizer, sums["loss"], float(grad_norm), model.parameters())
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)  # 4 bytes a parameter not held through sampling and scoring
    if health is not None:
        health.after_step(model.parameters())
    out = {k: v / max(totals.tokens, 1.0) for k, v in sums.items() if k != "loss"}
    if s.entropy is not None:  # the next step's coefficient, from this one's entropy over the group
        s.entropy.observe(out["entropy"])
        out["entropy_coef"] = coef
    return {**out, "loss": sums["loss"], "grad_norm": float(grad_norm), "learn/packing": n_packed / max(len(parts), 1)}


def _critic_step(critic, optimizer, mb: Experience, parts: list[list[int]], totals: Totals, s: LearnerSettings,
                 share: Share, scale: float, weight: float, idle: int = 0) -> dict:
    optimizer.zero_grad(set_to_none=True)
    dev, sums = model_device(critic), {}
    for rows, w_loss, w_stats in _with_idle(parts, idle, scale, weight):
        part = trimmed(mb, rows).to(dev)
        values = token_values(critic, part.input_ids, part.attention_mask, part.completion_mask.size(1),
                              s.packing)  # (b, t)
        loss, clipped = value_loss(values, part.values, part.returns, part.loss_mask,
                                   s.algorithm_settings.value_clip, totals)
        (loss * w_loss).backward()
        _add(sums, {"critic/loss": float(loss.detach()) * w_stats,
                    "clipped_tokens": clipped * float(part.loss_mask.sum()) * w_stats})
    share.sync(critic.parameters())
    grad_norm = _clip(critic, s.max_grad_norm)
    sums = share.total(sums)
    refuse_non_finite("critic", sums["critic/loss"], grad_norm, optimizer)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"critic/loss": sums["critic/loss"], "critic/grad_norm": float(grad_norm),
            "critic/value_clip_fraction": sums["clipped_tokens"] / max(totals.tokens, 1.0)}


def _with_idle(parts: list[list[int]], idle: int, scale: float, weight: float):
    """(rows, loss scale, statistics weight) of each micro-batch, then `idle` stand-ins at 0."""
    return [(rows, scale, weight) for rows in parts] + [([0], 0.0, 0.0)] * idle


def _clip(model, max_norm: float) -> torch.Tensor:
    """Clip to the global gradient norm (a DTensor norm comes back whole on every rank)."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def refuse_non_finite(what: str, loss: float, grad_norm: torch.Tensor, optimizer) -> None:
    """A non-finite loss or gradient would turn every weight (and Adam's moments) into NaN: the
    optimizer step is skipped and the update stops. The totals are the group's, so every rank of
    a learner group stops at the same step."""
    if math.isfinite(loss) and bool(torch.isfinite(grad_norm)):
        return
    optimizer.zero_grad(set_to_none=True)
    raise NonFiniteError(f"the {what}'s loss is {loss:g} and its gradient norm {float(grad_norm):g}: the optimizer "
                         f"step was skipped")


def _healthy(check, optimizer, *values) -> None:
    try:
        check(*values)
    except Exception:
        optimizer.zero_grad(set_to_none=True)
        raise


def _add(sums: dict, more: dict) -> None:
    for k, v in more.items():
        sums[k] = sums.get(k, 0.0) + v
