"""Multi-turn rollouts: trained ids are the sampled ids, tool turns are context only, tools fail
into error turns, and a trajectory's tokens do not depend on its batch-mates."""
from __future__ import annotations

import json

import pytest
import torch

from hindsight.models.load import load_causal_lm, load_tokenizer
from hindsight.models.source import resolve_model_path
from hindsight.models.tiny import teach_short_turns
from hindsight.rollout.multiturn.episodes import GymEpisode, ToolEpisode
from hindsight.rollout.multiturn.loop import TurnSettings, run_trajectories, to_experience
from hindsight.rollout.engines.hf import model_turns as turns_of
from hindsight.rollout.multiturn.parsers import get_parser
from hindsight.rollout.multiturn.tools import Tool, ToolCall, Toolbox
from tests.unit.rollout.multiturn_envs import games


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny tool model, taught in a few steps to answer a turn with a digit and end it: a
    random model almost never samples <|im_end|>, and a turn that does not end has no next."""
    path = resolve_model_path("tiny://qwen2-tools", tmp_path_factory.mktemp("models"))
    return teach_short_turns(load_causal_lm(path, "float32"), load_tokenizer(path)), load_tokenizer(path)


def _recording(model, tok):
    """Every turn's sampled tokens, as the engine's turns emitted them; and those turns."""
    emitted, real = [], turns_of(model, tok.pad_token_id)

    def spy(ids, mask, gens, *a, **k):
        out, cmask = real(ids, mask, gens, *a, **k)
        emitted.append([out[i, : int(cmask[i].sum())].tolist() for i in range(out.size(0))])
        return out, cmask

    return emitted, spy


def test_over_a_thousand_trajectories_the_trained_ids_are_the_sampled_ids(tiny):
    model, tok = tiny
    emitted, turns = _recording(model, tok)
    s = TurnSettings(max_turns=3, max_tokens=48, max_new_tokens=12, concurrency=4)
    rows = [{"prompt": f"Round {i}", "secret": i % 10} for i in range(128)]
    trajs, _ = run_trajectories(model, tok, rows, list(range(128)), 8, s, lambda: GymEpisode(games.GuessNumber()),
                                turns)
    assert len(trajs) == 1024
    # what each turn's decode emitted, by trajectory: turn k decodes, in order, every trajectory
    # with more than k model turns
    per_traj = [[] for _ in trajs]
    n_turns = [sum(x["role"] == "assistant" for x in t.turns) for t in trajs]
    for k, turn in enumerate(emitted):
        live = [i for i in range(len(trajs)) if n_turns[i] > k]
        assert len(live) == len(turn)
        for i, ids in zip(live, turn):
            per_traj[i].append(ids)
    exp = to_experience(model, trajs, 8, tok.pad_token_id, 1.0)
    multi = 0
    for b, t in enumerate(trajs):
        model_turns = [x for x in t.turns if x["role"] == "assistant"]
        multi += len(model_turns) > 1
        trained = exp.completion_ids[b][exp.loss_mask[b].bool()].tolist()
        # the trained ids are exactly the sampled turns, each as the decoder emitted it (a turn cut by
        # max_tokens: the prefix that fitted)
        assert trained == [x for turn in model_turns for x in t.ids[turn["start"]:turn["end"]]]
        for turn, ids in zip(model_turns, per_traj[b]):
            assert t.ids[turn["start"]:turn["end"]] == ids[: turn["end"] - turn["start"]]
            assert turn["end"] - turn["start"] == len(ids) or turn["end"] == s.max_tokens
        for turn in t.turns:  # tool/environment spans are context, never trained
            want = 1 if turn["role"] == "assistant" else 0
            assert set(t.action[turn["start"]:turn["end"]]) <= {want}
    assert multi > 500, "most trajectories should have several turns"
    differs = sum(t.retemplate_differs for t in trajs)
    print(f"re-applying the template would have changed {differs} of {len(trajs)} trajectories")


def test_a_turn_sampled_in_non_canonical_tokens_is_counted_as_a_re_template_mismatch(tiny):
    """The model may sample "assistant" as ass + istant; decoding and re-applying the template
    gives its one token: the trajectory would change, so it is counted (and trained as sampled)."""
    from hindsight.rollout.multiturn.render import first_prompt, retokenized

    model, tok = tiny
    end = tok.convert_tokens_to_ids("<|im_end|>")
    canonical = tok("assistant", add_special_tokens=False)["input_ids"]
    split = tok("ass", add_special_tokens=False)["input_ids"] + tok("istant", add_special_tokens=False)["input_ids"]
    assert len(canonical) == 1 and canonical != split and tok.decode(split) == "assistant"
    prompt = first_prompt(tok, "Say it", [], None)
    for ids, differs in ((canonical + [end], False), (split + [end], True)):
        turns = [{"role": "assistant", "start": 0, "end": len(ids), "text": "assistant"}]
        again = retokenized(tok, "Say it", [], None, turns)
        assert (again[: len(prompt) + len(ids)] != prompt + ids) is differs


def test_a_trajectory_does_not_depend_on_its_batch_mates(tiny):
    model, tok = tiny
    s = TurnSettings(max_turns=3, max_tokens=40, max_new_tokens=10)
    rows = [{"prompt": "Round a", "secret": 3}, {"prompt": "Round b", "secret": 7}]
    both, _ = run_trajectories(model, tok, rows, [11, 12], 2, s, lambda: GymEpisode(games.GuessNumber()),
                               turns_of(model, tok.pad_token_id))
    alone, _ = run_trajectories(model, tok, rows[1:], [12], 2, s, lambda: GymEpisode(games.GuessNumber()),
                                turns_of(model, tok.pad_token_id))
    assert [t.ids for t in both[2:]] == [t.ids for t in alone]


def test_environment_turns_get_exactly_zero_gradient(tiny):
    model, tok = tiny
    from hindsight.learning.update import LearnerSettings, update

    s = TurnSettings(max_turns=3, max_tokens=40, max_new_tokens=8)
    rows = [{"prompt": "Round a", "secret": 3}, {"prompt": "Round b", "secret": 7}]
    trajs, _ = run_trajectories(model, tok, rows, [1, 2], 2, s, lambda: GymEpisode(games.GuessNumber()),
                                turns_of(model, tok.pad_token_id))
    exp = to_experience(model, trajs, 2, tok.pad_token_id, 1.0)
    assert (exp.completion_mask.sum() > exp.loss_mask.sum()), "there are environment tokens"
    exp.rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    # the gradient of the loss with respect to each position's log-prob: zero off the sampled tokens
    from hindsight.learning.losses.objective import Objective, policy_loss
    from hindsight.learning.algorithms.advantages import grpo_advantages

    logp = exp.logprobs.clone().double().requires_grad_(True)
    loss, _ = policy_loss(logp, exp.logprobs.double() - 0.1, None, grpo_advantages(exp.rewards.double(), 2),
                          exp.loss_mask.double(), Objective.named("dapo"))
    loss.backward()
    env = (exp.completion_mask * (1 - exp.action_mask)).bool()
    assert logp.grad[env].abs().max() == 0 and logp.grad[exp.loss_mask.bool()].abs().sum() > 0
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    metrics = update(model, opt, exp, LearnerSettings())
    assert metrics["grad_norm"] > 0 and any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))


def test_hermes_calls_are_parsed_and_malformed_ones_are_named():
    parse = get_parser("hermes")
    calls = parse('Let me add.<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>')
    assert calls == [ToolCall("add", {"a": 1, "b": 2})]
    bad = parse('<tool_call>\n{"name": "add", "arguments": {"a": 1,}\n</tool_call>')
    assert bad[0].error and "not valid JSON" in bad[0].error
    assert parse("no call here") == []
    assert get_parser("json")('{"name": "add", "parameters": {"a": 1, "b": 2}}') == [ToolCall("add", {"a": 1, "b": 2})]


def test_a_failing_tool_is_an_error_turn_never_an_exception():
    box = Toolbox([Tool(games.add, "t"), Tool(games.explode, "t"), Tool(games.hang, "t", timeout_s=0.5)])
    ok = box.call(ToolCall("add", {"a": 2, "b": 3}))
    assert (ok.content, ok.error) == ("5", False)
    for call, says in [(ToolCall("explode", {"a": 1}), "ValueError: cannot take 1"),
                       (ToolCall("hang", {"seconds": 5}), "no answer within 0.5 s"),
                       (ToolCall("nope", {}), "no tool named 'nope'"),
                       (ToolCall("add", {"a": 1}), "missing b"),
                       (ToolCall("add", {"a": 1, "b": 2, "c": 3}), "takes no argument c"),
                       (ToolCall("", error="the tool call is not valid JSON"), "not valid JSON")]:
        res = box.call(call)
        assert res.error and says in res.content, res


def test_trl_environment_factory_class_runs_unchanged(tiny):
    model, tok = tiny
    ep = ToolEpisode([Tool(games.add, "t")], games.Counter(), "t")
    assert ep.start({"prompt": "p", "target": 2, "id": "x"}) == " Reach 2."
    assert sorted(ep.toolbox.tools) == ["add", "increment"]
    msgs, results, done = ep.respond("", [ToolCall("increment", {"step": 2})])
    assert not done and msgs == [{"role": "tool", "name": "increment", "content": "2"}] and ep.reward() == 1.0
    assert ep.respond("the end", [])[2] is True


def test_tools_in_the_first_prompt_and_tool_turns_as_template_tokens(tiny):
    model, tok = tiny
    s = TurnSettings(max_turns=2, max_tokens=400, max_new_tokens=6)

    class Scripted(ToolEpisode):  # the tiny model does not call tools: answer every turn with one
        def respond(self, text, calls, last=False):
            return super().respond(text, [ToolCall("add", {"a": 123, "b": 456})], last)

    trajs, _ = run_trajectories(model, tok, [{"prompt": "What is 123 + 456?"}], [5], 2, s,
                                lambda: Scripted([Tool(games.add, "t")]), turns_of(model, tok.pad_token_id))
    t = trajs[0]
    assert '"name": "add"' in tok.decode(t.prompt_ids)
    if t.cut != "tokens":  # the first turn ended at <|im_end|>
        tool_turn = t.turns[1]
        assert tool_turn["calls"][0]["result"] == "579"
        assert tok.decode(t.ids[tool_turn["start"]:tool_turn["end"]]) == (
            "\n<|im_start|>user\n<tool_response>\n579\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
        assert t.cut == "turns"
    json.dumps(t.turns)  # stored as JSON


def test_the_report_shades_model_turns_only():
    from hindsight.lookback.report import render_step_report

    turns = [{"role": "assistant", "start": 0, "end": 2, "text": "ab"},
             {"role": "tool", "start": 2, "end": 4, "text": "5", "tool": "add",
              "calls": [{"tool": "add", "arguments": {"a": 2, "b": 3}, "result": "5", "error": False, "seconds": 0.01}]},
             {"role": "assistant", "start": 4, "end": 5, "text": "c"}]
    row = {"index": 0, "group": 0, "prompt_id": "p", "prompt": "q", "completion_ids": [1, 2, 3, 4, 5],
           "logprobs": [-0.1, -0.2, 0.0, 0.0, -0.3], "ended_with_eos": True, "turns": json.dumps(turns), "cut": ""}
    page = render_step_report("r", 1, [row], [{"reward": 1.0, "ref_logprobs": None}], {0: 0.5}, {},
                              decode=lambda t: f"<{t}>")
    env = page.split('class="turn env-turn"')[1].split("</div></div>")[0]
    assert 'class="tok"' not in env and "add({&quot;a&quot;: 2, &quot;b&quot;: 3}) &rarr; 5" in env
    model = page.split('class="turn model-turn"')
    assert len(model) == 3 and model[1].count('class="tok"') == 2 and model[2].count('class="tok"') == 1


def test_trls_own_increment_env_and_a_plain_tools_list_run_unchanged(tiny):
    """TRL's IncrementEnv (reset without arguments, one tool method) and tools=[add], through the
    rollout loop: the calls the model makes are answered by the instance's state."""
    model, tok = tiny
    s = TurnSettings(max_turns=3, max_tokens=400, max_new_tokens=6)

    class Driven(ToolEpisode):  # the tiny model does not call tools: the scripted calls of a policy that does
        def respond(self, text, calls, last=False):
            return super().respond(text, [ToolCall("increment", {"a": 2}), ToolCall("add", {"a": 1, "b": 2})], last)

    trajs, episodes = run_trajectories(model, tok, [{"prompt": "Increment by two."}], [3], 2, s,
                                       lambda: Driven([Tool(games.add, "t")], games.IncrementEnv(), "t"),
                                       turns_of(model, tok.pad_token_id))
    prompt = tok.decode(trajs[0].prompt_ids)
    assert '"name": "increment"' in prompt and '"name": "add"' in prompt
    for t, ep in zip(trajs, episodes):
        results = [[c["result"] for c in turn["calls"]] for turn in t.turns if turn.get("calls")]
        assert results == [[str(2 * (k + 1)), "3"] for k in range(len(results))]  # the counter's own state
        assert ep.env._counter == 2 * len(results) and ep.reward() is None  # no get_reward: no env reward
