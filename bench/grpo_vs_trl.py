"""TRL's GRPOTrainer against hindsight's GRPO on the same tiny model, data, batch and sampling.

    python bench/grpo_vs_trl.py [--steps 8] [--rounds 2]

Both start from the same SFT checkpoint (trained here with TRL's SFTTrainer, ~20 s), use
16 prompts x 8 samples per step, 5 new tokens, temperature 1, lr 2e-4 constant, beta 0.02
(k3 in the loss), loss `grpo` (= our seq_mean_token_mean), group-scaled rewards and the
exact-answer reward. The two run alternately, `--rounds` times, in this one process; the
table shows the median per-round figures. Then the overhead: hindsight's full RL flow
(Prefect tasks, MLflow logging, Parquet rollout persistence, reward worker process) against
its bare kernel loop (generate -> score -> update in memory) on the same work.
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

PROMPTS, SAMPLES, NEW_TOKENS, LR, BETA = 16, 8, 5, 2e-4, 0.02


def setup(work: Path) -> tuple[str, list[dict]]:
    from hindsight.data import build_demo_data, read_jsonl
    from hindsight.models import build_tiny_model
    from hindsight.trainers import train_sft

    build_demo_data(work / "data", seed=0)
    base = build_tiny_model(work / "base")
    train_sft(str(base), str(work / "data/sft.jsonl"), work / "sft", lr=3e-3, epochs=3, batch_size=32,
              max_length=48, seed=0)
    return str(work / "sft"), read_jsonl(work / "data/prompts.jsonl")


def run_trl(init: str, rows: list[dict], steps: int, out: Path) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from rewards.exact import exact_answer

    tok = AutoTokenizer.from_pretrained(init)
    args = GRPOConfig(
        output_dir=str(out), per_device_train_batch_size=PROMPTS * SAMPLES, num_generations=SAMPLES,
        max_completion_length=NEW_TOKENS, temperature=1.0, top_p=1.0, learning_rate=LR, lr_scheduler_type="constant",
        beta=BETA, loss_type="grpo", scale_rewards="group", num_iterations=1, max_steps=steps, logging_steps=1,
        report_to=[], use_cpu=True, save_strategy="no", seed=0, max_grad_norm=1.0, disable_tqdm=True,
        dataloader_num_workers=0)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(init), reward_funcs=exact_answer, args=args,
                          train_dataset=Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows]),
                          processing_class=tok)
    t0 = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - t0
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    return {"seconds": seconds, "reward_last": statistics.mean(rewards[-3:])}


class Kernel:
    """hindsight's GRPO with nothing around it: generate -> score -> update, in memory."""

    def __init__(self, init: str):
        from hindsight.algorithms.losses import LossSettings
        from hindsight.learner import LearnerSettings
        from hindsight.models import load_causal_lm, load_tokenizer

        self.tok, self.policy = load_tokenizer(init), load_causal_lm(init)
        self.ref = load_causal_lm(init).eval()
        self.opt = torch.optim.AdamW(self.policy.parameters(), lr=LR, weight_decay=0.0)
        self.settings = LearnerSettings(loss=LossSettings(kl_coef=BETA, kl_estimator="k3", loss_agg="seq_mean_token_mean",
                                                          max_len=NEW_TOKENS))

    def step(self, batch: list[dict], seed: int) -> float:
        from hindsight.learner import update
        from hindsight.logprobs import token_logprobs
        from hindsight.rollout.hf import generate
        from hindsight.scoring import score_completions

        exp = generate(self.policy, self.tok, [r["prompt"] for r in batch], SAMPLES, NEW_TOKENS, seed=seed)
        texts = self.tok.batch_decode(exp.completion_ids, skip_special_tokens=True)
        answers = [r["answer"] for r in batch for _ in range(SAMPLES)]
        result = score_completions([("rewards.exact:exact_answer", 1.0)], texts, {"answer": answers})
        exp.rewards = torch.tensor(result.total)
        with torch.no_grad():
            exp.ref_logprobs, _ = token_logprobs(self.ref, exp.input_ids, exp.attention_mask, exp.completion_ids.size(1))
        update(self.policy, self.opt, exp, self.settings)
        return float(exp.rewards.mean())


def run_kernel(init: str, rows: list[dict], steps: int) -> dict:
    from hindsight.rl import prompt_indices

    kernel = Kernel(init)
    t0 = time.perf_counter()
    rewards, stamps = [], []
    for s in range(steps):
        rewards.append(kernel.step([rows[i] for i in prompt_indices(len(rows), PROMPTS, s, 0)], s))
        stamps.append(time.perf_counter())
    return {"seconds": time.perf_counter() - t0, "reward_last": statistics.mean(rewards[-3:]),
            "steady_step_s": (stamps[-1] - stamps[0]) / (steps - 1)}


def run_flow(init: str, work: Path, steps: int) -> dict:
    """The real RL flow; its per-step time is the `time/*` sum logged for each step."""
    from flows.rl import rl_flow
    from hindsight.config import PipelineConfig

    cfg = PipelineConfig.model_validate({
        "name": "bench", "run_dir": str(work / "flow-run"),
        "data": {"dir": str(work / "data"), "dvc_file": None, "build_demo": False,
                 "prompts": str(work / "data/prompts.jsonl"), "eval": str(work / "data/eval.jsonl")},
        "rl": {"init": init, "steps": steps, "prompts_per_step": PROMPTS, "samples_per_prompt": SAMPLES, "lr": LR,
               "kl": {"coef": BETA, "estimator": "k3"}, "rollout": {"max_new_tokens": NEW_TOKENS},
               "eval_every": 10_000, "save_every": 10_000},
        "eval": {"limit": 1, "max_new_tokens": NEW_TOKENS},
        "tracking": {"tracking_uri": f"sqlite:///{work}/mlflow.db"}})
    from mlflow.tracking import MlflowClient

    t0 = time.perf_counter()
    result = rl_flow(cfg, force=True)
    seconds = time.perf_counter() - t0
    history = MlflowClient(cfg.tracking.tracking_uri).get_metric_history(result.run_id, "reward/mean")
    stamps = sorted(m.timestamp for m in history)
    return {"seconds": seconds, "steady_step_s": (stamps[-1] - stamps[0]) / 1000 / (len(stamps) - 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    work = Path(tempfile.mkdtemp(prefix="hindsight-bench-"))
    init, rows = setup(work)
    results: dict[str, list[dict]] = {"trl": [], "hindsight": []}
    for r in range(a.rounds):  # alternate, so drift in machine load hits both
        torch.manual_seed(r)
        results["trl"].append(run_trl(init, rows, a.steps, work / f"trl-{r}"))
        torch.manual_seed(r)
        results["hindsight"].append(run_kernel(init, rows, a.steps))
    samples = a.steps * PROMPTS * SAMPLES
    print(f"\n{a.steps} steps x {PROMPTS} prompts x {SAMPLES} samples, {a.rounds} alternating rounds (median)")
    print(f"{'':<12}{'samples/s':>12}{'s/step':>10}{'reward (last 3 steps)':>24}")
    med = {}
    for name, runs in results.items():
        secs = statistics.median(x["seconds"] for x in runs)
        reward = statistics.median(x["reward_last"] for x in runs)
        med[name] = samples / secs
        print(f"{name:<12}{samples / secs:>12.1f}{secs / a.steps:>10.3f}{reward:>24.3f}")
    flow = run_flow(init, work, a.steps)
    kernel = run_kernel(init, rows, a.steps)
    kernel_step = kernel["steady_step_s"]
    print(f"overhead per step (steady state, from the end of step 1 to the end of the last): flow "
          f"{flow['steady_step_s']:.3f}s, kernel {kernel_step:.3f}s, overhead "
          f"{(flow['steady_step_s'] / kernel_step - 1) * 100:.1f}%")
    print(f"overhead end to end (incl. Prefect start, MLflow runs, eval, checkpoint, registry): flow "
          f"{flow['seconds']:.1f}s, kernel {kernel['seconds']:.1f}s, "
          f"overhead {(flow['seconds'] / kernel['seconds'] - 1) * 100:.1f}%")
    print(f"ratio hindsight/trl samples_per_s: {med['hindsight'] / med['trl']:.2f}")


if __name__ == "__main__":
    main()
