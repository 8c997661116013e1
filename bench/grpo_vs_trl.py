"""TRL's GRPOTrainer, hindsight sync (k = 0) and hindsight async (k = 1) on the same task and settings.

    python bench/grpo_vs_trl.py [--task sum|demo] [--steps 10] [--seeds 3]

The task is the long-completion worked sum (`hindsight/data/sumtask.py`, ~20 new tokens) unless
`--task demo`. All three start from one SFT checkpoint (TRL's SFTTrainer, here) and use the
same model, 16 prompts x 8 samples per step, `max_new_tokens`, temperature 1, lr 2e-4
constant, beta 0.02 (k3 in the loss), loss `grpo` (= our seq_mean_token_mean), group-scaled
rewards, and the same reward; hindsight reads the behaviour log-probs off the decoding logits
(`rollout.logprobs: decode`: TRL computes none when it takes one pass per batch). hindsight
runs its real RL flow (Prefect tasks, MLflow, the
rollout store). Per seed the three run in turn, so machine drift hits all; the table shows
medians over seeds. Rates are steady state: the median time between the ends of consecutive
steps, so model loading, process start-up and the final evaluation and checkpoint are left
out for all three alike.

Then the orchestration overhead: the flow (k = 0) against the bare kernel loop (generate ->
score -> update in memory, no Prefect, MLflow or store) on the same work, with the split of a
step into generate / score (reference + reward) / update / the rest.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

PROMPTS, SAMPLES, LR, BETA = 16, 8, 2e-4, 0.02
LAST = 5  # the final reward: the mean over the last LAST steps
TASKS = {  # task: (new tokens, reward)
    "sum": (24, "rewards.exact:final_answer"),
    "demo": (5, "rewards.exact:exact_answer"),
}


def setup(work: Path, task: str) -> tuple[str, list[dict]]:
    from hindsight.data.rows import read_jsonl
    from hindsight.data.demo import build_demo_data
    from hindsight.models.tiny import build_tiny_model
    from hindsight.data.sumtask import build_sum_data
    from hindsight.config import DataConfig
    from hindsight.trainers.supervised import train_sft

    (build_sum_data if task == "sum" else build_demo_data)(work / "data", seed=0)
    base = build_tiny_model(work / "base")
    data = DataConfig(sft=str(work / "data/sft.jsonl")).reading("sft")
    train_sft(str(base), data, work / "sft", lr=3e-3, epochs=3, batch_size=32,
              max_length=64, seed=0)
    return str(work / "sft"), read_jsonl(work / "data/prompts.jsonl")


def _reward_fn(spec: str):
    from hindsight.scoring.rewards import load_reward_fn

    return load_reward_fn(spec)


def run_trl(init: str, rows: list[dict], steps: int, seed: int, task: str, out: Path) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    new_tokens, reward = TASKS[task]
    stamps: list[float] = []

    class Stamp(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            stamps.append(time.perf_counter())

    tok = AutoTokenizer.from_pretrained(init)
    args = GRPOConfig(
        output_dir=str(out), per_device_train_batch_size=PROMPTS * SAMPLES, num_generations=SAMPLES,
        max_completion_length=new_tokens, temperature=1.0, top_p=1.0, learning_rate=LR, lr_scheduler_type="constant",
        beta=BETA, loss_type="grpo", scale_rewards="group", num_iterations=1, max_steps=steps, logging_steps=1,
        report_to=[], use_cpu=True, bf16=False, save_strategy="no", seed=seed, max_grad_norm=1.0, disable_tqdm=True,
        dataloader_num_workers=0)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(init), reward_funcs=_reward_fn(reward), args=args,
                          train_dataset=Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows]),
                          processing_class=tok, callbacks=[Stamp()])
    trainer.train()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    return {"step_s": _step_s(stamps), "reward_last": statistics.mean(rewards[-LAST:])}


def run_flow(init: str, work: Path, steps: int, seed: int, task: str, k: int, name: str) -> dict:
    """hindsight's real RL flow; per-step time from the MLflow timestamps of its step metrics."""
    from mlflow.tracking import MlflowClient

    from flows.rl import rl_flow
    from hindsight.config import PipelineConfig

    new_tokens, reward = TASKS[task]
    cfg = PipelineConfig.model_validate({
        "name": f"bench-{name}", "run_dir": str(work / f"flow-{name}"), "seed": seed,
        "data": {"dir": str(work / "data"), "dvc_file": None, "build_demo": False,
                 "prompts": str(work / "data/prompts.jsonl"), "eval": str(work / "data/eval.jsonl")},
        "rl": {"init": init, "steps": steps, "prompts_per_step": PROMPTS, "samples_per_prompt": SAMPLES, "lr": LR,
               "kl": {"coef": BETA, "estimator": "k3"}, "rewards": [{"fn": reward}],
               "rollout": {"max_new_tokens": new_tokens, "groups_per_batch": PROMPTS, "logprobs": "decode"},
               "async": {"max_staleness": k}, "eval_every": 10_000, "save_every": 10_000, "report_every": 10_000},
        "eval": {"limit": 1, "max_new_tokens": new_tokens, "reward": reward, "compare_versions": 0},
        "tracking": {"tracking_uri": f"sqlite:///{work}/mlflow.db"}})
    result = rl_flow(cfg, force=True)
    client = MlflowClient(cfg.tracking.tracking_uri)
    history = sorted(client.get_metric_history(result.run_id, "reward/mean"), key=lambda m: m.step)
    stamps = [m.timestamp / 1000 for m in history]
    split = {}
    for key in ("time/rollout_s", "time/rollout_wait_s", "time/score_s", "time/update_s", "time/compute/generate_s",
                "time/compute/score_s", "time/compute/learn_s"):  # recorded under runtime/ (lookback.metrics)
        values = [m.value for m in client.get_metric_history(result.run_id, f"runtime/{key}") if m.step > 1]
        if values:
            split[key] = statistics.median(values)
    compute = {}  # step -> seconds in the kernel's own work (engine, rewards + models, learner update)
    for key in ("time/compute/generate_s", "time/compute/score_s", "time/compute/learn_s"):
        for m in client.get_metric_history(result.run_id, f"runtime/{key}"):
            compute[m.step] = compute.get(m.step, 0.0) + m.value
    by_step = {m.step: m.timestamp / 1000 for m in history}
    inside = [(by_step[s] - by_step[s - 1]) / compute[s] - 1 for s in sorted(by_step)[1:-1] if s in compute and s - 1 in by_step]
    lengths = [m.value for m in client.get_metric_history(result.run_id, "response_length/mean")]
    return {"step_s": _step_s(stamps), "reward_last": statistics.mean(m.value for m in history[-LAST:]), "split": split,
            "overhead_inside": statistics.median(inside) if inside else None, "length": statistics.mean(lengths)}


class Kernel:
    """hindsight's GRPO with nothing around it: generate -> score -> update, in memory, timed by phase."""

    def __init__(self, init: str, task: str):
        from hindsight.learning.losses.objective import Objective
        from hindsight.learning.update import LearnerSettings
        from hindsight.models.load import load_causal_lm, load_tokenizer

        self.new_tokens, self.reward = TASKS[task]
        self.tok, self.policy = load_tokenizer(init), load_causal_lm(init)
        self.ref = load_causal_lm(init).eval()
        self.opt = torch.optim.AdamW(self.policy.parameters(), lr=LR, weight_decay=0.0)
        self.settings = LearnerSettings(loss=Objective.named("grpo", kl_coef=BETA, kl_estimator="k3",
                                                                max_len=self.new_tokens))
        self.split = {"generate": [], "score": [], "update": []}
        self.lengths: list[float] = []  # mean completion tokens per step

    def step(self, batch: list[dict], step: int, seed: int) -> float:
        from hindsight.learning.update import update
        from hindsight.maths.logprobs import group_token_logprobs
        from hindsight.rollout.seeds import group_seed
        from hindsight.rollout.hf import sample_groups
        from hindsight.scoring.rewards import score_completions

        t0 = time.perf_counter()
        # the flow's own per-group seeds: the same samples, so the same work (a completion stops
        # at its answer, so other seeds would give other lengths and another step time)
        exp = sample_groups(self.policy, self.tok, [r["prompt"] for r in batch],
                            [group_seed(seed, step, g) for g in range(len(batch))], SAMPLES, self.new_tokens,
                            logprobs="decode")
        t1 = time.perf_counter()
        self.lengths.append(float(exp.completion_mask.sum(-1).float().mean()))
        texts = self.tok.batch_decode(exp.completion_ids, skip_special_tokens=True)
        answers = [r["answer"] for r in batch for _ in range(SAMPLES)]
        exp.rewards = torch.tensor(score_completions([(self.reward, 1.0)], texts, {"answer": answers}).total)
        with torch.no_grad():
            exp.ref_logprobs, _ = group_token_logprobs(self.ref, exp.input_ids, exp.attention_mask,
                                                       exp.completion_ids.size(1), SAMPLES)
        t2 = time.perf_counter()
        update(self.policy, self.opt, exp, self.settings)
        t3 = time.perf_counter()
        for key, dt in zip(self.split, (t1 - t0, t2 - t1, t3 - t2)):
            self.split[key].append(dt)
        return float(exp.rewards.mean())


def run_kernel(init: str, rows: list[dict], steps: int, seed: int, task: str) -> dict:
    from hindsight.coordination.prompts import prompt_indices

    kernel, stamps = Kernel(init, task), []
    for s in range(steps):
        kernel.step([rows[i] for i in prompt_indices(len(rows), PROMPTS, s, seed)], s, seed)
        stamps.append(time.perf_counter())
    return {"step_s": _step_s(stamps), "split": {k: statistics.median(v[1:]) for k, v in kernel.split.items()},
            "length": statistics.mean(kernel.lengths)}


def _step_s(stamps: list[float]) -> float:
    """Steady-state seconds per step: the median gap between consecutive step ends, so one-off
    work (the first step's warm-up, a final evaluation or checkpoint) does not count."""
    return statistics.median(b - a for a, b in zip(stamps, stamps[1:]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", choices=sorted(TASKS), default="sum")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seeds", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    work = Path(tempfile.mkdtemp(prefix="hindsight-bench-"))
    init, rows = setup(work, a.task)
    runs: dict[str, list[dict]] = {"trl": [], "hindsight sync": [], "hindsight async k=1": []}
    kernels = []
    for seed in range(a.seeds):  # in turn, so drift in machine load hits all alike
        runs["trl"].append(run_trl(init, rows, a.steps, seed, a.task, work / f"trl-{seed}"))
        runs["hindsight sync"].append(run_flow(init, work, a.steps, seed, a.task, 0, f"sync-{seed}"))
        kernels.append(run_kernel(init, rows, a.steps, seed, a.task))
        runs["hindsight async k=1"].append(run_flow(init, work, a.steps, seed, a.task, 1, f"async-{seed}"))
    new_tokens = TASKS[a.task][0]
    print(f"\ntask {a.task}: {a.steps} steps x {PROMPTS} prompts x {SAMPLES} samples, {new_tokens} new tokens, "
          f"{a.seeds} seeds (median; reward: mean of the last {LAST} steps, min-max over seeds)")
    print(f"{'':<22}{'samples/s':>10}{'s/step':>9}{'reward':>9}{'spread':>16}")
    rate = {}
    for name, rs in runs.items():
        step_s = statistics.median(r["step_s"] for r in rs)
        rewards = [r["reward_last"] for r in rs]
        rate[name] = PROMPTS * SAMPLES / step_s
        print(f"{name:<22}{rate[name]:>10.1f}{step_s:>9.3f}{statistics.median(rewards):>9.3f}"
              f"{f'{min(rewards):.3f}-{max(rewards):.3f}':>16}")
    for name in ("hindsight sync", "hindsight async k=1"):
        split = {k: statistics.median(r["split"][k] for r in runs[name] if k in r["split"])
                 for k in runs[name][0]["split"]}
        print(f"{name} split (s/step): " + ", ".join(f"{k.removeprefix('time/')} {v:.3f}" for k, v in split.items()))
    flow, kernel = (statistics.median(r["step_s"] for r in rs) for rs in (runs["hindsight sync"], kernels))
    print("mean completion tokens (the same work only if these agree): sync flow "
          f"{statistics.mean(r['length'] for r in runs['hindsight sync']):.2f}, "
          f"kernel {statistics.mean(r['length'] for r in kernels):.2f}")
    print("kernel split (s/step): " + ", ".join(f"{k} {statistics.median(r['split'][k] for r in kernels):.3f}"
                                                for k in kernels[0]["split"]))
    print(f"overhead per step (sync flow against the bare kernel, steady state, each run right after the "
          f"other): flow {flow:.3f}s, kernel {kernel:.3f}s, overhead {(flow / kernel - 1) * 100:.1f}%")
    inside = statistics.median(r["overhead_inside"] for r in runs["hindsight sync"])
    print(f"overhead per step inside the sync flow (step wall time against the kernel's own work in it: the "
          f"engine, rewards + reference, the learner update; same run, so free of machine drift): {inside * 100:.1f}%")
    print(f"ratio async/sync samples_per_s: {rate['hindsight async k=1'] / rate['hindsight sync']:.2f}")
    print(f"ratio hindsight/trl samples_per_s: {rate['hindsight async k=1'] / rate['trl']:.2f} (async k=1)")


if __name__ == "__main__":
    main()
