"""Trajectory records (what a trace holds) built from stored rows, and their MLflow form."""
import json

from hindsight.lookback.traces import eval_records, prompt_hash, redact, secret_values, step_records, trace_id


def _rows():
    turns = [{"role": "assistant", "start": 0, "end": 2, "text": "<tool_call>add</tool_call>"},
             {"role": "tool", "start": 2, "end": 4, "text": "5", "tool": "add",
              "calls": [{"tool": "add", "arguments": {"a": 2, "b": 3}, "result": "5", "error": "", "seconds": 0.01}]},
             {"role": "assistant", "start": 4, "end": 5, "text": "5"}]
    rows = []
    for g in range(3):
        for j in range(2):
            rows.append({"index": g * 2 + j, "group": g, "prompt": f"q{g}", "prompt_id": f"p{g}", "completion": "5",
                         "weights_version": 3, "logprobs": [-0.5, -1.5, 0.0, 0.0, -0.25], "ended_with_eos": True,
                         "turns": json.dumps(turns) if g == 0 else None, "cut": ""})
    scores = [{"index": r["index"], "reward": 1.0 + r["index"], "reward_exact": 1.0, "rm_score": None} for r in rows]
    return rows, scores


def test_a_step_keeps_its_budget_of_whole_groups_with_turns_calls_and_feedback():
    rows, scores = _rows()
    recs = step_records(rows[::-1], scores, {0: 0.5, 1: -0.5}, 4, "run1", lambda g: 100 + g, budget=4)
    assert [r["attributes"]["index"] for r in recs] == [0, 1, 2, 3]  # groups 0 and 1, whole
    first = recs[0]
    assert first["id"] == trace_id("run1", "train", 4, 0) and first["id"].startswith("tr-") and len(first["id"]) == 35
    assert {k: first["attributes"][k] for k in ("step", "group", "sample", "policy_version", "seed")} == \
        {"step": 4, "group": 0, "sample": 0, "policy_version": 3, "seed": 100}
    assert first["tags"]["hindsight.prompt_hash"] == prompt_hash("q0")
    assert [(s["type"], s["name"]) for s in first["spans"]] == [("LLM", "model turn 1"), ("TOOL", "tool add"),
                                                                 ("LLM", "model turn 2")]
    turn = first["spans"][0]["attributes"]  # log-probs of tokens 0..2 of the trajectory
    assert turn == {"tokens": 2, "logprob_mean": -1.0, "logprob_min": -1.5, "entropy_estimate": 1.0, "ended": True}
    assert first["spans"][1]["inputs"] == {"arguments": {"a": 2, "b": 3}} and first["spans"][1]["outputs"]["result"] == "5"
    assert first["feedback"] == {"reward": 1.0, "reward/exact": 1.0, "advantage": 0.5}
    single = recs[2]  # no turns: one model turn, the whole completion
    assert [s["name"] for s in single["spans"]] == ["model turn 1"] and single["spans"][0]["attributes"]["tokens"] == 5
    assert step_records(rows, scores, {}, 4, "run1", lambda g: 0, budget=0) == []


def test_eval_records_are_capped_and_marked_correct():
    recs = eval_records([{"prompt": "1+1", "answer": "2", "correct": True}] * 5, 0, "r", cap=3)
    assert len(recs) == 3 and recs[0]["feedback"] == {"correct": 1.0} and recs[1]["tags"]["hindsight.kind"] == "eval"
    assert len({r["id"] for r in recs}) == 3


def test_secret_values_from_the_environment_never_reach_a_trace():
    env = {"HINDSIGHT_JUDGE_API_KEY": "sk-live-0123456789", "OPENAI_TOKEN": "tok-abcdefgh", "PATH": "/usr/bin:/bin",
           "SHORT_KEY": "abc"}
    secrets = secret_values(env)
    assert secrets == ["sk-live-0123456789", "tok-abcdefgh"]
    rec = {"outputs": {"completion": "my key is sk-live-0123456789"}, "spans": [{"outputs": {"result": "tok-abcdefgh!"}}]}
    assert json.dumps(redact(rec, secrets)).count("[redacted]") == 2 and "sk-live" not in json.dumps(redact(rec, secrets))


def test_a_record_becomes_an_mlflow_trace_linked_to_its_run():
    from tracking.trace_send import to_trace

    rows, scores = _rows()
    rec = step_records(rows, scores, {0: 0.5}, 1, "run1", lambda g: 7, budget=1)[0]
    trace = to_trace(rec, "run1", "5")
    assert trace.info.trace_id == rec["id"] and trace.info.trace_metadata["mlflow.sourceRun"] == "run1"
    assert trace.info.experiment_id == "5" and trace.info.tags["hindsight.step"] == "1"
    root, *children = trace.data.spans
    assert root.parent_id is None and all(c.parent_id == root.span_id for c in children)
    assert root.inputs == {"prompt": "q0"} and [c.span_type for c in children] == ["LLM", "TOOL", "LLM"]
    assert {a.name: a.value for a in trace.info.assessments} == rec["feedback"]
    assert to_trace(rec, "run1", "5").data.spans[1].span_id == children[0].span_id  # the same ids when written again
