"""The typed batch that flows from rollout through score to update (after OpenRLHF's Experience),
and how a batch is cut into micro-batches within a token budget.

Layout follows TRL: prompts left-padded, completions right-padded, so one concatenation
gives the model input and the completion tokens sit at a fixed offset.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Experience:
    prompt_ids: torch.Tensor        # (B, P) left-padded
    prompt_mask: torch.Tensor       # (B, P)
    completion_ids: torch.Tensor    # (B, T) right-padded
    completion_mask: torch.Tensor   # (B, T) 1 up to and including EOS
    logprobs: torch.Tensor          # (B, T) behaviour policy's log-probs of the sampled tokens
    group_size: int
    rewards: torch.Tensor | None = None      # (B,) weighted total
    ref_logprobs: torch.Tensor | None = None  # (B, T)
    advantages: torch.Tensor | None = None    # (B,) or (B, T)
    engine_logprobs: torch.Tensor | None = None  # (B, T) a non-hf engine's own log-probs, for the IS weight
    values: torch.Tensor | None = None        # (B, T) the critic's values before the update (algorithms with a critic)
    returns: torch.Tensor | None = None       # (B, T) the critic's targets
    action_mask: torch.Tensor | None = None   # (B, T) multi-turn: 1 on tokens the policy sampled, 0 on tool turns
    ended: torch.Tensor | None = None         # (B,) bool: the completion ended with an end token (not cut)
    reward_parts: torch.Tensor | None = None  # (B, K) each reward's raw score, named in meta["reward_names"]
    meta: dict = field(default_factory=dict)

    @property
    def loss_mask(self) -> torch.Tensor:
        """(B, T) the tokens the policy chose: every loss, KL, advantage and value is over these.
        A multi-turn trajectory's tool and environment turns are context (attended to, never
        trained on); a single completion's mask is its completion mask."""
        if self.action_mask is None:
            return self.completion_mask
        return self.completion_mask * self.action_mask

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)   # (B, P+T)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.completion_mask], dim=1)  # (B, P+T)

    def to(self, device) -> "Experience":
        """The same batch with every tensor on `device` (the learner's)."""
        moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in vars(self).items()}
        return Experience(**moved)

    def rows(self, index: list[int]) -> "Experience":
        """The batch restricted to some sequences (a process's share), keeping the padded width."""
        picked = {k: v[index] if isinstance(v, torch.Tensor) else v for k, v in vars(self).items()}
        return Experience(**picked)

    def __len__(self) -> int:
        return self.prompt_ids.size(0)


def _lengths_mask(seqs: list[list], width: int, left: bool) -> torch.Tensor:
    lengths = torch.tensor([len(s) for s in seqs])                     # (B,)
    cols = torch.arange(width)[None, :]                                # (1, W)
    if left:
        return cols >= (width - lengths)[:, None]                      # (B, W) bool
    return cols < lengths[:, None]                                     # (B, W) bool


def _pad(seqs: list[list], pad, dtype, left: bool, min_width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One tensor from all values at once, scattered through the mask (row-major, like the
    concatenated rows): a tensor per row cost ~1 ms a batch, paid several times a step."""
    width = max(min_width, max(len(s) for s in seqs))
    keep = _lengths_mask(seqs, width, left)                            # (B, W)
    out = torch.full((len(seqs), width), pad, dtype=dtype)             # (B, W)
    out[keep] = torch.tensor([v for s in seqs for v in s], dtype=dtype)
    return out, keep.long()


def pad_left(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _pad(seqs, pad_id, torch.long, left=True, min_width=0)


def pad_right(seqs: list[list[float]], pad, dtype=torch.long) -> tuple[torch.Tensor, torch.Tensor]:
    return _pad(seqs, pad, dtype, left=False, min_width=1)


def experience_from_rows(rows: list[dict], pad_id: int, group_size: int, scores: list[dict] | None = None) -> Experience:
    """The padded batch of stored rollout rows (and their score rows, when given)."""
    prompt_ids, prompt_mask = pad_left([r["prompt_ids"] for r in rows], pad_id)
    completion_ids, mask = pad_right([r["completion_ids"] for r in rows], pad_id)
    logprobs, _ = pad_right([r["logprobs"] for r in rows], 0.0, dtype=torch.float32)
    exp = Experience(prompt_ids, prompt_mask, completion_ids, mask, logprobs, group_size)
    if rows[0].get("action_mask") is not None:
        exp.action_mask, _ = pad_right([r["action_mask"] for r in rows], 0)
    if rows[0].get("engine_logprobs") is not None:
        exp.engine_logprobs, _ = pad_right([r["engine_logprobs"] for r in rows], 0.0, dtype=torch.float32)
    if "ended_with_eos" in rows[0]:
        exp.ended = torch.tensor([bool(r["ended_with_eos"]) for r in rows])
    if scores is not None:
        exp.rewards = torch.tensor([s["reward"] for s in scores], dtype=torch.float32)
        names = [k for k in scores[0] if k.startswith("reward_")] + (["rm_score"] if scores[0].get("rm_score") is not None
                                                                       else [])
        if names:
            exp.reward_parts = torch.tensor([[s[k] for k in names] for s in scores], dtype=torch.float32)  # (B, K)
            exp.meta["reward_names"] = [k.removeprefix("reward_") for k in names]
        if scores[0]["ref_logprobs"] is not None:
            exp.ref_logprobs, _ = pad_right([s["ref_logprobs"] for s in scores], 0.0, dtype=torch.float32)
    return exp


def advantage_rows(step: int, rows: list[dict], exp: Experience) -> list[dict]:
    """Per trained completion: its advantage (the token mean for token-level estimators)."""
    adv, mask = exp.advantages, exp.loss_mask.to(torch.float32)                  # (B,) or (B, T); (B, T)
    if adv.dim() == 2:
        per_token = adv
        adv = (adv * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)                  # (B,)
    else:
        per_token = None
    return [{"step": step, "index": r["index"], "advantage": float(adv[j]),
             "token_advantages": per_token[j, : len(r["completion_ids"])].tolist() if per_token is not None else None}
            for j, r in enumerate(rows)]


def lengths(exp: Experience) -> tuple[list[int], list[int]]:
    """Real prompt and completion tokens of each row."""
    return exp.prompt_mask.sum(-1).tolist(), exp.completion_mask.sum(-1).tolist()


def micro_batches(prompt_len: list[int], completion_len: list[int], group_size: int,
                  budget: int | None) -> list[list[int]]:
    """Row indices of each micro-batch: within `budget` padded tokens (rows x (widest prompt +
    widest completion)), longest first. Whole groups are kept together when a group fits, so the
    shared-prompt forward still applies; a group larger than the budget is cut into rows, and a
    row larger than the budget is a micro-batch of its own. None: one micro-batch."""
    n = len(prompt_len)
    if not budget:
        return [list(range(n))]
    groups = [list(range(g, min(g + group_size, n))) for g in range(0, n, group_size)]
    units = []
    for g in groups:
        if len(g) * (max(prompt_len[i] for i in g) + max(completion_len[i] for i in g)) <= budget:
            units.append(g)
        else:
            units.extend([i] for i in g)
    units.sort(key=lambda u: -max(prompt_len[i] + completion_len[i] for i in u))  # stable: ties keep their order
    out, rows, p_w, c_w = [], [], 0, 0
    for unit in units:
        up, uc = max(prompt_len[i] for i in unit), max(completion_len[i] for i in unit)
        if rows and (len(rows) + len(unit)) * (max(p_w, up) + max(c_w, uc)) > budget:
            out.append(rows)
            rows, p_w, c_w = [], 0, 0
        rows, p_w, c_w = rows + unit, max(p_w, up), max(c_w, uc)
    if rows:
        out.append(rows)
    return out


def trimmed(exp: Experience, rows: list[int]) -> Experience:
    """The rows as a batch of their own, without the padding columns none of them uses: left
    padding of the prompts (positions come from the mask, so nothing moves) and right padding of
    the completions."""
    part = exp.rows(rows)
    p = int(part.prompt_mask.sum(-1).max())
    t = max(int(part.completion_mask.sum(-1).max()), 1)
    out = {}
    for k, v in vars(part).items():
        if k in ("prompt_ids", "prompt_mask"):
            v = v[:, v.size(1) - p:]                                          # (b, p)
        elif isinstance(v, torch.Tensor) and v.dim() == 2 and k != "reward_parts":
            v = v[:, :t]                                                      # (b, t): every token-level field
        out[k] = v
    return Experience(**out)
