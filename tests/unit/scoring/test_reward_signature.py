"""A reward's parameters against what its calls pass: TRL's keywords, the data's columns, its args."""


def test_a_required_parameter_no_call_passes_is_named():
    from hindsight.scoring.reward_fns import missing_columns

    def needs_answers(completions, answers, prompts=None, **kw):
        return [0.0] * len(completions)

    def takes_all(prompts, completions, completion_ids, answer, *, tests, run_context, scale=1.0, **kw):
        return [0.0] * len(completions)

    assert missing_columns(needs_answers, {"answer", "id"}, None) == ["answers"]
    assert missing_columns(needs_answers, {"answers"}, None) == []
    assert missing_columns(needs_answers, set(), {"answers": [1]}) == []  # given in the reward's args
    assert missing_columns(takes_all, {"answer"}, None) == ["tests"]
    assert missing_columns(takes_all, {"answer", "tests"}, None) == []
