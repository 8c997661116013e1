"""A reward's return is validated the same way inline and in the worker process: a list of one
real number per completion, else one clear error; a bad element gets the fallback, counted."""
import sys

import pytest

from hindsight.errors import RewardError
from hindsight.scoring.guarded import RewardWorker
from hindsight.scoring.rewards import score_completions

pytestmark = pytest.mark.integration  # each case also runs in a reward worker process

COMPLETIONS = ["a", "bb", "ccc"]
RETURNS = {
    "as_string": "return '111'",
    "as_dict": "return {c: 1.0 for c in completions}",
    "as_none": "return None",
    "as_number": "return 1.0",
    "too_short": "return [1.0]",
    "exits": "import sys; sys.exit(0)",
    "mixed": "return [1.0, '1', None]",
    "nan_inf": "return [float('nan'), float('inf'), True]",
    "numpy": "import numpy as np; return np.array([0.5, 1.5, 2.5])",
    "tensor_items": "import torch; return [torch.tensor(0.5), torch.tensor([1.5]), np.float32(2.5)]",
}


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rewards")
    body = "import numpy as np\n\n" + "".join(f"def {name}(completions, **kw):\n    {code}\n\n" for name, code in RETURNS.items())
    (folder / "bad_returns_mod.py").write_text(body)
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))


def _outcome(name, worker):
    try:
        res = score_completions([(f"bad_returns_mod:{name}", 1.0)], COMPLETIONS, {}, fallback=-1.0, worker=worker,
                                timeout_s=60)
    except RewardError as exc:
        return "error", str(exc)
    return res.total, res.failures[name]


@pytest.mark.parametrize("name, expected", [
    ("as_string", ("error", "reward 'bad_returns_mod:as_string' returned str '111', not a list of 3 scores")),
    ("as_dict", ("error", "reward 'bad_returns_mod:as_dict' returned dict {'a': 1.0, 'bb': 1.0, 'ccc': 1.0}, "
                          "not a list of 3 scores")),
    ("as_none", ("error", "reward 'bad_returns_mod:as_none' returned NoneType None, not a list of 3 scores")),
    ("as_number", ("error", "reward 'bad_returns_mod:as_number' returned float 1.0, not a list of 3 scores")),
    ("too_short", ("error", "reward 'bad_returns_mod:too_short' returned 1 scores for 3 completions")),
    ("exits", ("error", "reward 'bad_returns_mod:exits' called sys.exit(0); a reward returns its scores, it never exits")),
    ("mixed", ([1.0, -1.0, -1.0], 2)),        # a string is never parsed: "1" is not a score
    ("nan_inf", ([-1.0, -1.0, 1.0], 2)),      # True is a real number (1), as in Python
    ("numpy", ([0.5, 1.5, 2.5], 0)),
    ("tensor_items", ([0.5, 1.5, 2.5], 0)),
])
def test_inline_and_process_isolation_agree(module, name, expected):
    worker = RewardWorker()
    try:
        assert _outcome(name, None) == expected
        assert _outcome(name, worker) == expected
    finally:
        worker.close()
