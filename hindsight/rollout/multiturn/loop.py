"""The multi-turn rollout: model turns sampled as tokens, tool or environment turns appended as
the template's tokens, until each trajectory ends.

A turn decodes every live trajectory at once (the engine's `continue_turns`: hf's runs
`rollout.hf.decode`), each from its own generator, so a trajectory's tokens never depend on its
batch-mates; then every live trajectory's episode answers at once in a thread pool: a slow tool
holds only the turn, not a tool call after another. A trajectory ends when its episode says so (no tool call, a terminal
environment), at `max_turns` model turns (cut: `turns`), or when the next tokens would pass
`max_tokens` (cut: `tokens`). What is trained is `ids` with `action` 1 on the sampled tokens.
"""
from __future__ import annotations

import concurrent.futures as cf
from dataclasses import dataclass, field

import torch

from hindsight.maths.experience import Experience, pad_left, pad_right
from hindsight.maths.logprobs import budgeted_logprobs, model_device
from hindsight.rollout.decoding import end_token_ids
from hindsight.rollout.multiturn.parsers import get_parser
from hindsight.rollout.multiturn.tools import ToolCall
from hindsight.rollout.multiturn.render import bridge, first_prompt, retokenized


@dataclass(frozen=True, kw_only=True)
class TurnSettings:
    max_turns: int = 4              # model turns
    max_tokens: int = 256           # every token after the first prompt: model turns and tool turns
    max_new_tokens: int = 64        # one model turn
    temperature: float = 1.0
    top_p: float = 1.0
    parser: str = "hermes"
    concurrency: int = 8            # episodes answering at once


@dataclass
class Trajectory:
    prompt_ids: list[int]
    seed: int
    extra: str | None = None                      # what reset() added to the user turn
    ids: list[int] = field(default_factory=list)  # every token after the prompt
    action: list[int] = field(default_factory=list)  # 1: sampled by the policy; 0: a tool or environment turn
    turns: list[dict] = field(default_factory=list)  # each turn's span [start, end) in `ids`, role, text, tool, ...
    done: bool = False
    cut: str = ""                                 # "turns" or "tokens" when a limit ended it
    env_reward: float | None = None
    retemplate_differs: bool = False              # the template applied again to the decoded turns differs

    @property
    def final_text(self) -> str:
        """The last model turn's text: what rewards read as the completion."""
        return next((t["text"] for t in reversed(self.turns) if t["role"] == "assistant"), "")

    @property
    def ended_with_eos(self) -> bool:
        return bool(self.turns) and self.turns[-1]["role"] == "assistant" and not self.cut


def turn_generator(t: Trajectory, turn: int, device) -> torch.Generator:
    """A generator of its own for each turn of each trajectory: a turn decodes as many steps as
    its longest batch-mate needs, drawing for every row, so a generator carried over turns would
    make the next turn depend on who shared this one."""
    return torch.Generator(device=device).manual_seed(t.seed * 1_009 + turn)


@torch.no_grad()
def run_trajectories(model, tok, rows: list[dict], seeds: list[int], group_size: int, s: TurnSettings,
                     new_episode, turns) -> tuple[list[Trajectory], list]:
    """`group_size` trajectories of each row (its `prompt` and columns), group i from seeds[i],
    each model turn played by `turns` (an engine's `continue_turns`). Returns the trajectories in
    group order and their episodes (for their rewards)."""
    stops = end_token_ids(tok, model)
    trajs, episodes = [], []
    for row, seed in zip(rows, seeds):
        for j in range(group_size):
            ep = new_episode()
            extra = ep.start(row)
            trajs.append(Trajectory(first_prompt(tok, row["prompt"], ep.toolbox.schemas, extra), seed * 1_013 + j,
                                    extra))
            episodes.append(ep)
    was_training = model.training
    model.eval()
    with cf.ThreadPoolExecutor(max(1, s.concurrency)) as pool:
        for turn in range(s.max_turns):
            live = [i for i, t in enumerate(trajs) if not t.done]
            if not live:
                break
            gens = [turn_generator(trajs[i], turn, model_device(model)) for i in live]
            _model_turn(turns, tok, [trajs[i] for i in live], gens, s, stops)
            talking = [i for i in live if not trajs[i].done]
            last = turn == s.max_turns - 1
            answers = pool.map(lambda i, last=last: episodes[i].respond(trajs[i].final_text, _calls(s, trajs[i]), last),
                               talking)
            for i, answer in zip(talking, answers):
                _answer_turn(tok, trajs[i], *answer, last=last, s=s, stops=stops)
    model.train(was_training)
    for i, (t, ep) in enumerate(zip(trajs, episodes)):
        t.env_reward = ep.reward()
        again = retokenized(tok, rows[i // group_size]["prompt"], ep.toolbox.schemas, t.extra, t.turns)
        t.retemplate_differs = again[: len(t.prompt_ids) + len(t.ids)] != t.prompt_ids + t.ids
    return trajs, episodes


def _calls(s: TurnSettings, t: Trajectory):
    """The turn's calls. A parser bounds and catches what a string can raise; anything that still
    escapes one is an error turn too: a model's sample never fails a step (and, seeded, would fail
    the stage's retry again)."""
    try:
        return get_parser(s.parser)(t.final_text)
    except Exception as exc:
        return [ToolCall("", error=f"the tool call cannot be read ({type(exc).__name__})")]


def _model_turn(turns, tok, live: list[Trajectory], gens, s: TurnSettings, stops) -> None:
    room = [s.max_tokens - len(t.ids) for t in live]
    ids, mask = pad_left([t.prompt_ids + t.ids for t in live], tok.pad_token_id)      # (N, L)
    out, cmask = turns(ids, mask, gens, min(s.max_new_tokens, max(room)), s.temperature, s.top_p, stops)  # (N, T')
    for k, t in enumerate(live):
        new = out[k, : int(cmask[k].sum())].tolist()[: room[k]]
        start = len(t.ids)
        t.ids += new
        t.action += [1] * len(new)
        t.turns.append({"role": "assistant", "start": start, "end": len(t.ids),
                        "text": tok.decode(new, skip_special_tokens=True)})
        if not new or new[-1] not in stops:  # cut inside the turn: nothing can follow it
            t.done, t.cut = True, "tokens"


def _answer_turn(tok, t: Trajectory, messages: list[dict], results: list, done: bool, last: bool, s: TurnSettings,
                 stops) -> None:
    if done:
        t.done = True
        return
    if last:
        t.done, t.cut = True, "turns"
        return
    ids = bridge(tok, messages, stops)
    if len(t.ids) + len(ids) >= s.max_tokens:  # no room left for the model to answer it
        t.done, t.cut = True, "tokens"
        return
    start = len(t.ids)
    t.ids += ids
    t.action += [0] * len(ids)
    turn = {"role": messages[0]["role"], "start": start, "end": len(t.ids),
            "text": "\n".join(m["content"] for m in messages)}
    if results:
        turn["calls"] = [{"tool": r.name, "arguments": r.arguments, "result": r.content, "error": r.error,
                          "seconds": round(r.seconds, 6)} for r in results]
        turn["tool"] = results[0].name
    t.turns.append(turn)


def to_experience(model, trajs: list[Trajectory], group_size: int, pad_id: int, temperature: float,
                  budget: int | None = None, packing: str = "off") -> Experience:
    """The batch the learner trains on: prompts left-padded, the trajectories right-padded with
    every real token attended (`completion_mask`) and only the sampled ones trained
    (`action_mask`); the behaviour log-probs are one forward of the training model over the
    whole trajectory, kept on the sampled tokens."""
    prompt_ids, prompt_mask = pad_left([t.prompt_ids for t in trajs], pad_id)            # (B, P)
    completion_ids, completion_mask = pad_right([t.ids or [pad_id] for t in trajs], pad_id)  # (B, T)
    completion_mask = completion_mask * torch.tensor([[1 if t.ids else 0] for t in trajs])  # an empty trajectory
    action_mask, _ = pad_right([t.action or [0] for t in trajs], 0)                      # (B, T)
    exp = Experience(prompt_ids, prompt_mask, completion_ids, completion_mask,
                     torch.zeros(completion_mask.shape), group_size, action_mask=action_mask)
    was_training = model.training
    model.eval()
    logp = budgeted_logprobs(model, exp, temperature, budget, packing)                    # (B, T)
    model.train(was_training)
    exp.logprobs = logp.cpu() * exp.loss_mask
    return exp
