"""No model sample can fail a step: every parser and the call path turn any text into text, an
error turn the model reads, or a call (never an exception out of the rollout).

- A property-based fuzz (hypothesis, a fixed seed and budget) of 10,000 generated and adversarial
  outputs per parser, each parsed and answered by a toolbox;
- the red team's samples (1,000 nested brackets, the same as a JSON string 5,000 deep, a
  5,000-digit integer, a call past the size bound, a lone surrogate) through the real rollout
  loop, with a scripted sampler standing in for the model's decoding.
"""
from __future__ import annotations

import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from hindsight.models.load import load_causal_lm, load_tokenizer
from hindsight.models.source import resolve_model_path
from hindsight.rollout.multiturn.episodes import ToolEpisode
from hindsight.rollout.multiturn.loop import TurnSettings, run_trajectories
from hindsight.rollout.multiturn.parsers import PARSERS
from hindsight.rollout.multiturn.tools import Tool, ToolCall, Toolbox
from tests.unit.rollout.multiturn_envs import games

EXAMPLES = 10_000


def adversarial() -> st.SearchStrategy[str]:
    """Text a model might write, and text written to break a parser."""
    breaks = st.sampled_from(["\n", "\r", "\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\u2029"])
    scalar = st.one_of(st.integers(), st.floats(allow_nan=True), st.text(max_size=20), st.booleans(), st.none(),
                       st.just("9" * 5000), st.just('"\\ud800"'), st.just("1e999"))
    nested = st.integers(1, 3000).map(lambda n: "[" * n + "]" * n)
    unclosed = st.integers(1, 3000).map(lambda n: "{\"a\":" * n)
    as_string = st.integers(1, 6000).map(lambda n: json.dumps("[" * n))
    body = st.one_of(
        st.text(max_size=200),
        st.builds(lambda name, args: json.dumps({"name": name, "arguments": args}),
                  st.sampled_from(["add", "nope", "", "__class__"]),
                  st.dictionaries(st.text(max_size=5), scalar, max_size=4)),
        st.builds(lambda name, raw: '{"name": "%s", "arguments": %s}' % (name, raw),
                  st.sampled_from(["add", "x"]), st.one_of(nested, as_string, unclosed, st.just("9" * 5000))),
        st.builds(lambda name, raw: '{"name": "%s", "parameters": %s}' % (name, raw),
                  st.sampled_from(["add", "x"]), st.one_of(nested, as_string, st.just('"\\ud800"'))),
        nested, unclosed, st.just("x" * 20_000))
    wrapped = st.builds(lambda pre, b, brk, close: f"{pre}<tool_call>{brk}{b}{brk}{'</tool_call>' if close else ''}",
                        st.text(max_size=20), body, breaks, st.booleans())
    return st.one_of(body, wrapped, st.lists(wrapped, max_size=3).map("".join))


@pytest.mark.parametrize("parser", sorted(PARSERS))
def test_no_output_escapes_a_parser_or_the_call_path(parser, record_property):
    toolbox = Toolbox([Tool(games.add, "t")])
    tried = []

    @settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(adversarial())
    def check(text):
        calls = PARSERS[parser](text)
        assert isinstance(calls, list) and all(isinstance(c, ToolCall) for c in calls)
        for call in calls:
            result = toolbox.call(call)
            assert isinstance(result.content, str) and (result.error or call.error is None)
            json.dumps({"arguments": result.arguments, "result": result.content})  # storable
        tried.append(text)

    check()
    record_property("fuzz", f"{parser}: {len(tried)} model outputs tried, none escaped")  # in the run's summary
    assert len(tried) >= EXAMPLES


RED_TEAM = {
    "nested": '<tool_call>{"name": "add", "arguments": ' + "[" * 1000 + "]" * 1000 + "}</tool_call>",
    "nested-string": '<tool_call>{"name": "add", "arguments": ' + json.dumps("[" * 5000) + "}</tool_call>",
    "digits": '<tool_call>{"name": "add", "arguments": {"a": ' + "9" * 5000 + ', "b": 1}}</tool_call>',
    "huge": '<tool_call>{"name": "add", "arguments": {"a": "' + "x" * 40_000 + '"}}</tool_call>',
    "surrogate": '<tool_call>{"name": "add", "arguments": {"a": "\\ud800", "b": 1}}</tool_call>',
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = resolve_model_path("tiny://qwen2-tools", tmp_path_factory.mktemp("models"))
    return load_causal_lm(path, "float32"), load_tokenizer(path)


@pytest.mark.parametrize("name", sorted(RED_TEAM))
def test_the_red_teams_samples_become_error_turns_in_the_rollout(tiny, monkeypatch, name):
    """A scripted sampler writes the sample as the model's first turn (and a plain answer after):
    the trajectory goes on with an error turn the model reads, and nothing is raised."""
    model, tok = tiny
    end = tok.convert_tokens_to_ids("<|im_end|>")
    script = [tok.encode(RED_TEAM[name], add_special_tokens=False) + [end], tok.encode("done") + [end]]

    def scripted(ids, mask, gens, max_new, *a, **k):  # an engine whose model writes the script
        turn = script.pop(0) if script else tok.encode("ok") + [end]
        out = torch.tensor([turn] * ids.size(0))
        return out, torch.ones_like(out)

    s = TurnSettings(max_turns=3, max_tokens=60_000, max_new_tokens=60_000)
    trajs, _ = run_trajectories(model, tok, [{"prompt": "What is 1 + 2?"}], [1], 1, s,
                                lambda: ToolEpisode([Tool(games.add, "t")]), scripted)
    calls = [c for turn in trajs[0].turns for c in turn.get("calls", [])]
    assert calls and calls[0]["error"] is True and calls[0]["result"].startswith("error: ")
    json.dumps(trajs[0].turns)  # stored as JSON
