"""Held-out accuracy: greedy answers to eval prompts, judged by a reward function (score >= 1).

The answers are decoded by the RL sampler at temperature 0 (`rollout.decoding`): the same end
tokens as training, and no setting taken from the checkpoint's generation config.

The judge goes through the same guarded scoring as training rewards (`score_completions`):
TRL's keyword contract, a timeout in the reward worker, and the fallback when it fails.
`cfg` is the pipeline's config (`hindsight.config.PipelineConfig`, which sits above this role).
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from hindsight.data.chat import display_prompt
from hindsight.errors import RewardError
from hindsight.data.rows import load_rows
from hindsight.models.load import load_causal_lm, load_tokenizer
from hindsight.progress import Ticker
from hindsight.rollout.decoding import decoding_record
from hindsight.rollout.hf import sample_groups
from hindsight.scoring.guarded import RewardWorker
from hindsight.scoring.rewards import score_completions


@torch.no_grad()
def greedy_answers(model, tok, prompts: list[str], max_new_tokens: int,
                   batch_size: int = 64) -> tuple[list[str], list[list[int]]]:
    """(answer texts, their token ids) for each prompt."""
    texts: list[str] = []
    ids: list[list[int]] = []
    with Ticker("eval", len(prompts), "answered") as ticker:  # beats within a batch too (8 prompts, one batch)
        for i in range(0, len(prompts), batch_size):
            chunk = prompts[i:i + batch_size]
            exp = sample_groups(model, tok, chunk, [0] * len(chunk), 1, max_new_tokens, temperature=0.0,
                                logprobs="decode")
            texts.extend(tok.batch_decode(exp.completion_ids, skip_special_tokens=True))
            ids.extend(row[m.bool()].tolist() for row, m in zip(exp.completion_ids, exp.completion_mask))
            ticker.update(len(texts))
    return texts, ids


def greedy_trajectories(model, tok, rows: list[dict], max_new_tokens: int, multi_turn,
                        batch_size: int = 64) -> tuple[list[str], list[list[int]], dict]:
    """Multi-turn: each row's greedy trajectory with the run's tools or environment. (the last
    model turn's texts, every model token of each, the `env_reward` column)."""
    from hindsight.rollout.engines.hf import model_turns
    from hindsight.rollout.multiturn.loop import TurnSettings, run_trajectories
    from hindsight.rollout.multiturn.setup import episode_factory

    s = TurnSettings(max_turns=multi_turn.max_turns, max_tokens=multi_turn.max_tokens, max_new_tokens=max_new_tokens,
                     temperature=0.0, parser=multi_turn.parser, concurrency=multi_turn.concurrency)
    episodes, trajs, turns = episode_factory(multi_turn), [], model_turns(model, tok.pad_token_id)
    with Ticker("eval", len(rows), "played") as ticker:
        for i in range(0, len(rows), batch_size):
            chunk = rows[i:i + batch_size]
            trajs += run_trajectories(model, tok, chunk, [0] * len(chunk), 1, s, episodes, turns)[0]
            ticker.update(len(trajs))
    ids = [[x for x, a in zip(t.ids, t.action) if a] for t in trajs]
    return [t.final_text for t in trajs], ids, {"env_reward": [t.env_reward for t in trajs]}


def judge(model, tok, rows: list[dict], reward_spec: str, max_new_tokens: int, worker=None,
          timeout_s: float = 60.0, fallback: float = 0.0, multi_turn=None) -> list[tuple[str, bool]]:
    """Greedy answer and its correctness for each row: the cells of a version comparison. With
    `multi_turn` (rl.rollout.multi_turn), the answer is a greedy trajectory's last turn."""
    prompts = [r["prompt"] for r in rows]
    if multi_turn is None:
        (answers, ids), more = greedy_answers(model, tok, prompts, max_new_tokens), {}
    else:
        answers, ids, more = greedy_trajectories(model, tok, rows, max_new_tokens, multi_turn)
    columns = {**{k: [r.get(k) for r in rows] for k in rows[0] if k != "prompt"}, **more}
    result = score_completions([(reward_spec, 1.0)], answers, columns, fallback, worker, timeout_s,
                               prompts=prompts, completion_ids=ids)
    if answers and result.failures and max(result.failures.values()) >= len(answers):
        (error,) = result.errors.values() or ["?"]
        raise RewardError(f"eval.reward {reward_spec} failed on all {len(answers)} eval answers: {error}; an "
                          f"accuracy from the fallback would mean nothing")
    return [(a, s >= 1.0) for a, s in zip(answers, result.total)]


def accuracy(model, tok, rows: list[dict], reward_spec: str, max_new_tokens: int, worker=None,
             timeout_s: float = 60.0, fallback: float = 0.0, multi_turn=None) -> tuple[float, list[str]]:
    judged = judge(model, tok, rows, reward_spec, max_new_tokens, worker, timeout_s, fallback, multi_turn)
    return sum(1.0 for _, ok in judged if ok) / len(rows), [a for a, _ in judged]


def eval_rows(cfg) -> list[dict]:
    return load_rows(**cfg.data.reading("eval", limit=cfg.eval.limit))


def evaluate_model(cfg, model, tok, worker=None) -> float:
    """Held-out accuracy with the config's eval settings; every stage reports it the same way.
    The judge runs guarded like any reward: in `worker`, or in a worker of its own when
    rl.scoring.isolation is `process`."""
    return evaluate_answers(cfg, model, tok, worker)[0]


def evaluate_answers(cfg, model, tok, worker=None) -> tuple[float, list[dict]]:
    """The accuracy and each answer: {"prompt" (as text), "answer", "correct"}, in eval order."""
    rows = eval_rows(cfg)
    with judge_worker(cfg, worker) as w:
        judged = judge(model.eval(), tok, rows, cfg.eval.reward, cfg.eval.max_new_tokens, w,
                       cfg.rl.scoring.timeout_s, cfg.rl.scoring.fallback, cfg.rl.rollout.multi_turn)
    answers = [{"prompt": display_prompt(r["prompt"]), "answer": a, "correct": ok} for r, (a, ok) in zip(rows, judged)]
    return sum(1.0 for a in answers if a["correct"]) / len(rows), answers


@contextmanager
def judge_worker(cfg, worker=None):
    """The given reward worker, or a fresh one for this evaluation (closed after), or None inline."""
    if worker is not None or cfg.rl.scoring.isolation != "process":
        yield worker
        return
    own = RewardWorker.for_run(cfg.rl)
    try:
        yield own
    finally:
        own.close()


def evaluate_path(cfg, path: str) -> tuple[float, dict]:
    """The accuracy of the model in folder `path`, and the decoding it was measured with."""
    model, tok = load_causal_lm(path, cfg.model.dtype), load_tokenizer(path)
    return evaluate_model(cfg, model, tok), decoding_record(tok, model, cfg.eval)
