"""Reward functions the RL tests name in their configs ("helpers:varied"); tests/ is on the
import path of the test process and, through it, of the Ray actors the tests start."""
from pathlib import Path


def varied(completions, **_):
    """Not constant within a group, so every estimator sees a signal."""
    return [float(len(c) % 3) for c in completions]


def hangs_once(completions, **_):
    """`varied`, except that the first call after $HINDSIGHT_TEST_HANG's file appears removes it and
    never returns: a reward stuck while its process lives (a hung role, not a dead one)."""
    import os
    import time

    marker = Path(os.environ.get("HINDSIGHT_TEST_HANG", "/nonexistent"))
    if marker.exists():
        marker.unlink()
        time.sleep(3600)
    return varied(completions)


def slow(completions, **_):
    """`varied`, after $HINDSIGHT_TEST_SLOW_S seconds: a reward that is slow, not stuck."""
    import os
    import time

    time.sleep(float(os.environ.get("HINDSIGHT_TEST_SLOW_S", "0")))
    return varied(completions)


def stops_itself(completions, **_):
    """SIGSTOPs its own process: a reward worker that falls silent on every call."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGSTOP)
    return varied(completions)


class Guess:
    """A gym-style game for multi-turn tests: guess the answer's last digit, told higher or lower."""

    def reset(self, **row):
        self.secret = int(row["answer"]) % 10
        return "Guess my digit."

    def step(self, text):
        digits = [c for c in text if c.isdigit()]
        if digits and int(digits[0]) == self.secret:
            return "correct", 1.0, True, False, {}
        return ("higher" if not digits or int(digits[0]) < self.secret else "lower"), 0.0, False, False, {}


def short_turn_model(folder, name: str = "tiny://qwen2-tools"):
    """tiny://qwen2-tools (or `name`) taught to end its turns (`teach_short_turns`), saved in `folder`."""
    from hindsight.models.load import load_causal_lm, load_tokenizer
    from hindsight.models.source import resolve_model_path
    from hindsight.models.tiny import teach_short_turns

    path = resolve_model_path(name, Path(folder).parent / "models")
    tok = load_tokenizer(path)
    teach_short_turns(load_causal_lm(path, "float32"), tok).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def rl_cfg(tmp_path, rewards=None, lr=None, **rl):
    """A small RL-only config on the demo data under tmp_path, in today's keys; `rewards` go to
    rl.scoring.rewards, `lr` to rl.learner.lr, and `rl` overrides the rest of the rl section."""
    from hindsight.config import PipelineConfig

    scoring = {"isolation": "inline", "rewards": rewards or [{"fn": "helpers:varied"}], **rl.pop("scoring", {})}
    learner = {**({"lr": lr} if lr is not None else {}), **rl.pop("learner", {})}
    return PipelineConfig.model_validate({
        "name": "c", "run_dir": str(tmp_path / "run"),
        "data": {"dir": str(tmp_path / "data"), "dvc_file": None, "prompts": str(tmp_path / "data/prompts.jsonl"),
                 "eval": str(tmp_path / "data/eval.jsonl")},
        "rl": {"steps": 2, "prompts_per_step": 4, "samples_per_prompt": 4, "rollout": {"max_new_tokens": 4},
               "scoring": scoring, **({"learner": learner} if learner else {}), **rl}})


def tiny_init(tmp_path, **config):
    """The demo data and a one-layer tiny model under tmp_path; `config` overrides its HF config."""
    from transformers import AutoConfig

    from hindsight.data.demo import build_demo_data
    from hindsight.models.tiny import build_tiny_model

    build_demo_data(tmp_path / "data", seed=0)
    path = build_tiny_model(tmp_path / "init", hidden=32, layers=1, heads=2)
    if config:
        cfg = AutoConfig.from_pretrained(path)
        for k, v in config.items():
            setattr(cfg, k, v)
        cfg.save_pretrained(path)
    return str(path)


def half_fail(completions, **_):
    """Fails (None, a non-score) on every other completion."""
    return [None if i % 2 else 1.0 for i in range(len(completions))]


def run_rl_killable(work, env, config: str, run_dir: str, fault: str | None = None):
    """`hindsight run rl -c WORK/CONFIG` with run_dir runs/RUN_DIR in its own session (HINDSIGHT_FAULT
    set to `fault`, if given); afterwards kill what a SIGKILL orphaned (Prefect's temporary server,
    the reward worker, Ray), which would otherwise hold the output open. The log is both stdout
    and stderr of the returned CompletedProcess."""
    import os
    import signal
    import subprocess
    import sys

    e = {**env, **({"HINDSIGHT_FAULT": fault} if fault else {})}
    log = work / f"{run_dir}-{'crash' if fault else 'run'}.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "cli", "run", "rl", "-c", str(work / config),
                                 "--set", f"run_dir=runs/{run_dir}"], cwd=work, env=e, stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=600)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    text = log.read_text()
    return subprocess.CompletedProcess(proc.args, rc, text, text)


def paused_pid(marker: Path) -> int:
    """The pid a `pause:point:step:MARKER` fault wrote, once it has fired (hindsight/faults.py)."""
    import time

    while not marker.exists():
        time.sleep(0.05)
    return int(marker.read_text())


def stop_when_paused(marker: Path) -> None:
    """In a thread: SIGSTOP the process that reaches the pause fault's point, hung, not dead."""
    import os
    import signal
    import threading

    threading.Thread(target=lambda: os.kill(paused_pid(marker), signal.SIGSTOP), daemon=True).start()


def grads_at_step(optimizer) -> dict:
    """The gradients each parameter had when `optimizer` stepped (the update frees them right
    after its step), by id(param), filled by a pre-step hook: the last step's, clipped."""
    seen: dict = {}

    def keep(opt, *_):
        seen.clear()
        seen.update({id(p): p.grad.clone() for group in opt.param_groups for p in group["params"] if p.grad is not None})

    optimizer.register_step_pre_hook(keep)
    return seen
