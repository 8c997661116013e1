"""Multi-turn asks the engine (issue 48): a turn is the engine's `continue_turns`; an engine
that declares `multi_turn` implements it, and one that does not says so by name."""
import pytest

from hindsight.rollout.engines.base import ENGINES, Engine


def test_every_multi_turn_engine_implements_continue_turns():
    for name, cls in ENGINES.items():
        assert cls.multi_turn == (cls.continue_turns is not Engine.continue_turns), name
    assert ENGINES["hf"].multi_turn and ENGINES["vllm"].multi_turn


def test_an_engine_without_turns_says_so():
    class OneShot(Engine):  # an engine that samples whole completions only
        name = "one-shot"

    engine = object.__new__(OneShot)
    with pytest.raises(NotImplementedError, match="one-shot cannot continue a trajectory turn by turn"):
        engine.continue_turns(None, None, [], 4, 1.0, 1.0, (0,))
