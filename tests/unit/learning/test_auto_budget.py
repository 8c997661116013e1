"""`rl.learner.micro_batch_tokens: auto` (hindsight.learning.fit): the line through the probes
and the rows it allows, by hand; a budget fitted under a cap below what the whole step needs
keeps the step's peak under that cap; a cap that leaves no row is one error naming the knobs."""
import pytest
import torch

from hindsight.errors import ConfigError
from hindsight.learning.losses.objective import Objective
from hindsight.learning.fit import BudgetFit, fit_budget, fit_line, measure_peak, pending_bytes, rows_that_fit
from hindsight.learning.update import LearnerSettings, update
from hindsight.maths.experience import Experience

PROMPT, COMPLETION, ROWS = 16, 112, 16
WIDTH = PROMPT + COMPLETION


def test_the_line_through_the_probes_by_hand():
    # peaks of 10 + 3 t MB at t = 100, 200, 400 tokens
    points = [(100, 310), (200, 610), (400, 1210)]
    assert fit_line(points) == pytest.approx((10.0, 3.0))
    # noisy probes: the least-squares slope 8/7, the line lifted onto the highest point above it (100, 500)
    intercept, slope = fit_line([(100, 500), (200, 400), (400, 800)])
    assert slope == pytest.approx(8 / 7) and intercept == pytest.approx(500 - 800 / 7)
    # an allocator that reused pages measures less for more: never trust a falling line, take the steepest ratio
    assert fit_line([(100, 500), (200, 400), (400, 300)]) == (0.0, 5.0)
    # 1,000 bytes free, 10 fixed, 3 a token, rows of 30 tokens: (1000 - 10) // 90 = 11 rows
    assert rows_that_fit(1000, 10, 3, 30) == 11
    assert rows_that_fit(50, 10, 3, 30) == 0


def test_a_fit_is_kept_and_refits_only_on_wider_rows():
    fit = BudgetFit(budget=1280, width=256, cap_bytes=2**30, per_token_bytes=1e5, fixed_bytes=1e6)
    assert BudgetFit.from_json(fit.to_json()) == fit
    assert not fit.outgrown(320) and fit.outgrown(321)  # 25 % wider


def test_pending_state_counts_gradients_and_adam_moments_not_yet_allocated():
    model = torch.nn.Linear(10, 4)  # 44 float32 parameters: 176 bytes
    opt = torch.optim.AdamW(model.parameters())
    assert pending_bytes((model, opt)) == 176 + 2 * 176
    model(torch.ones(1, 10)).sum().backward()
    opt.step()
    assert pending_bytes((model, opt)) == 0


def _model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=8000, hidden_size=128, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg)


def _batch(rows: int, seed: int = 0) -> Experience:
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(5, 8000, (rows // 4, PROMPT), generator=g).repeat_interleave(4, 0)     # (B, P)
    completions = torch.randint(5, 8000, (rows, COMPLETION), generator=g)                        # (B, T)
    exp = Experience(prompts, torch.ones_like(prompts), completions, torch.ones_like(completions),
                     -torch.rand(rows, COMPLETION, generator=g), 4)
    exp.rewards = torch.rand(rows, generator=g)
    return exp


def test_auto_keeps_the_step_under_a_cap_the_whole_step_would_break():
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    loss = Objective(kl_coef=0.0, max_len=COMPLETION)
    update(model, opt, _batch(4, seed=1), LearnerSettings(loss=loss))  # AdamW's state, as a running learner holds it
    exp, cpu = _batch(ROWS), torch.device("cpu")
    whole = measure_peak(cpu, lambda: update(model, opt, exp, LearnerSettings(loss=loss)))
    from hindsight.learning.fit import held_bytes

    held = held_bytes(cpu)
    cap = held + whole // 2  # the whole step's extra would go over it twice
    fit = fit_budget(model, opt, PROMPT, COMPLETION, cap, ROWS)
    assert WIDTH <= fit.budget < ROWS * WIDTH and fit.budget % WIDTH == 0
    start = held_bytes(cpu)
    peak = measure_peak(cpu, lambda: update(model, opt, exp, LearnerSettings(loss=loss, micro_batch_tokens=fit.budget)))
    assert start + peak <= cap, (start, peak, cap, fit)


def test_a_cap_that_leaves_no_row_is_one_error_naming_the_knobs():
    from hindsight.learning.fit import _release, held_bytes

    model = _model()
    opt = torch.optim.AdamW(model.parameters())
    # freed heap left by the tests before this one in the worker goes back to the system first:
    # the fit trims it too, and a resident set measured before the trim is a cap with room in it
    _release()
    with pytest.raises(ConfigError, match="memory_cap_mb.*max_new_tokens.*gradient_checkpointing"):
        fit_budget(model, opt, PROMPT, COMPLETION, held_bytes(torch.device("cpu")), ROWS)


def test_a_run_fits_its_budget_once_logs_it_and_a_resumed_run_takes_the_kept_fit(tmp_path, monkeypatch):
    from hindsight.coordination.run import RLRun
    from hindsight.learning import rank
    from tests.helpers import rl_cfg, tiny_init

    init = tiny_init(tmp_path)
    cfg = rl_cfg(tmp_path, steps=2, save_every=1, learner={"micro_batch_tokens": "auto", "memory_cap_mb": 64000})
    run = RLRun(cfg, init, None)
    try:
        budget = run.rl.learner.micro_batch_tokens  # what the roles were built with: a number
        kept = run.learner.budget_fit
        assert isinstance(budget, int) and budget == kept["budget"] and budget % kept["width"] == 0
        # fitted for the widest row the run can sample: the longest prompt and max_new_tokens
        from hindsight.data.bounds import longest_prompt
        from hindsight.data.rows import load_rows

        prompts = load_rows(**cfg.data.reading("prompts"))
        assert kept["width"] == longest_prompt(prompts, run.tok) + cfg.rl.rollout.max_new_tokens
        assert kept["cap_bytes"] == 64000 * 2**20
        for step in range(2):
            run.rollout(step), run.score(step)
            metrics = run.update(step)
            assert metrics["learn/micro_batch_tokens"] == budget and metrics["learn/budget_refits"] == 0
            run.checkpoint(step + 1)
        assert run.ckpt.manifest()["micro_batch_fit"] == kept
    finally:
        run.close()

    def no_probe(*a, **k):
        raise AssertionError("a resumed run probed again instead of taking its checkpoint's fit")

    monkeypatch.setattr(rank, "fit_budget", no_probe)
    resumed = RLRun(rl_cfg(tmp_path, steps=3, save_every=1, learner={"micro_batch_tokens": "auto",
                                                                     "memory_cap_mb": 64000}), init, None)
    try:
        assert resumed.start_step == 2 and resumed.learner.budget_fit == kept
        assert resumed.rl.learner.micro_batch_tokens == budget
    finally:
        resumed.close()
    monkeypatch.undo()
    # a new cap is a new fit: the kept one was made for another
    recapped = RLRun(rl_cfg(tmp_path, steps=3, save_every=1, learner={"micro_batch_tokens": "auto",
                                                                     "memory_cap_mb": 32000}), init, None)
    try:
        assert recapped.learner.budget_fit["cap_bytes"] == 32000 * 2**20
    finally:
        recapped.close()


def test_a_step_with_rows_wider_than_the_fit_is_fitted_again(tmp_path):
    from dataclasses import replace

    from hindsight.coordination.run import RLRun
    from tests.helpers import rl_cfg, tiny_init

    init = tiny_init(tmp_path)
    run = RLRun(rl_cfg(tmp_path, steps=1, learner={"micro_batch_tokens": "auto", "memory_cap_mb": 64000}), init, None)
    try:
        rank = run.learner.rank
        rank.budget = replace(rank.budget, width=4)  # as if fitted for rows much narrower than this step's
        run.rollout(0), run.score(0)
        metrics = run.update(0)
        assert metrics["learn/budget_refits"] == 1
        exp_width = rank.budget.width
        assert exp_width > 4 * 1.25 and metrics["learn/micro_batch_tokens"] == rank.budget.budget
        assert rank.settings.micro_batch_tokens == rank.budget.budget  # the update after it uses the new fit
    finally:
        run.close()


def test_a_probe_that_runs_out_of_memory_ends_the_probing(monkeypatch):
    from hindsight.learning import fit as fitting

    model = _model()
    opt = torch.optim.AdamW(model.parameters())
    real = fitting._probe_rows

    def tight(model, rows, prompt, completion, seed):  # as if the device held 2 rows at most
        if rows > 2:
            raise torch.OutOfMemoryError("CUDA out of memory (forced)")
        return real(model, rows, prompt, completion, seed)

    monkeypatch.setattr(fitting, "_probe_rows", tight)
    cap = fitting.held_bytes(torch.device("cpu")) + 2**30
    got = fit_budget(model, opt, PROMPT, COMPLETION, cap, ROWS)  # the line through the 1- and 2-row probes
    assert got.budget >= WIDTH and all(p.grad is None for p in model.parameters())
    monkeypatch.setattr(fitting, "_probe_rows", lambda *a, **k: (_ for _ in ()).throw(torch.OutOfMemoryError("forced")))
    with pytest.raises(ConfigError, match="one row of 128 tokens ran out of memory"):
        fit_budget(model, opt, PROMPT, COMPLETION, cap, ROWS)


def test_a_multi_turn_run_fits_for_its_first_prompt_with_the_tools_schemas(tmp_path):
    """The template renders the tools' schemas into a trajectory's first prompt (here ~100 tokens
    of JSON): the widest row is that prompt plus `multi_turn.max_tokens`, not the user's prompt."""
    from hindsight.coordination.run import RLRun
    from hindsight.data.bounds import longest_prompt
    from hindsight.data.demo import build_demo_data
    from hindsight.data.rows import load_rows
    from hindsight.models.source import resolve_model_path
    from hindsight.rollout.multiturn.render import first_prompt_text
    from hindsight.rollout.multiturn.setup import tool_schemas
    from tests.helpers import rl_cfg

    build_demo_data(tmp_path / "data", seed=0)
    init = resolve_model_path("tiny://qwen2-tools", tmp_path / "models")
    mt = {"tools": ["tests.unit.rollout.multiturn_envs.games:add"], "isolation": "in_process", "max_tokens": 24}
    cfg = rl_cfg(tmp_path, rollout={"max_new_tokens": 4, "multi_turn": mt},
                 learner={"micro_batch_tokens": "auto", "memory_cap_mb": 64000})
    run = RLRun(cfg, init, None)
    try:
        prompts = load_rows(**cfg.data.reading("prompts"))
        schemas = tool_schemas(cfg.rl.rollout.multi_turn)
        with_tools = longest_prompt(prompts, run.tok, first_prompt_text(run.tok, schemas))
        assert with_tools > longest_prompt(prompts, run.tok, first_prompt_text(run.tok, [])) + 20
        assert run.learner.budget_fit["width"] == with_tools + 24
    finally:
        run.close()
