"""SFT and reward-model training on TRL's trainers; hindsight only wires data and config in."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from hindsight.data.rows import load_rows
from hindsight.trainers.launch import TRAINERS


# The data is shuffled once with the seed and read in order, so step k trains on the same
# global batch whether one process reads it or N processes read a share each (the sampler a
# Trainer builds for one process and the one accelerate builds for N draw different orders).
_SAME_BATCHES = {"train_sampling_strategy": "sequential"}


def _lora_config(lora):
    if lora is None or not lora.enabled:
        return None
    from peft import LoraConfig

    return LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                      target_modules=lora.target_modules, task_type="CAUSAL_LM")


@TRAINERS.named("sft")
def train_sft(model_path: str, data: dict, out_dir: str | Path, *, lr: float, epochs: float,
              batch_size: int, max_length: int, seed: int, lora=None, max_steps: int = -1,
              log=None, gradient_checkpointing: bool = False) -> dict:
    """Fine-tune on prompt/completion demonstrations (`data`: `DataConfig.reading("sft")`);
    returns the final training metrics."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from hindsight.models.load import load_causal_lm, load_tokenizer

    rows = load_rows(**data)
    # a `tools` column (tool-use traces, TRL's form) is rendered by the template with the schemas it holds
    keep = ("prompt", "completion", "tools") if all("tools" in r for r in rows) else ("prompt", "completion")
    dataset = Dataset.from_list([{k: r[k] for k in keep} for r in rows]).shuffle(seed=seed)
    tok = load_tokenizer(model_path)
    args = SFTConfig(
        output_dir=str(out_dir) + ".trainer", learning_rate=lr, num_train_epochs=epochs,
        max_steps=max_steps, per_device_train_batch_size=_per_device(batch_size), max_length=max_length,
        seed=seed, data_seed=seed, report_to="none", save_strategy="no", logging_steps=10,
        lr_scheduler_type="cosine", warmup_steps=0.05,
        completion_only_loss=True, disable_tqdm=True, **_SAME_BATCHES, **_precision(),
        **_checkpointing(gradient_checkpointing),
    )
    trainer = SFTTrainer(model=load_causal_lm(model_path), args=args, train_dataset=dataset,
                         processing_class=tok, peft_config=_lora_config(lora),
                         callbacks=[_metric_callback(log, "sft")] if log else None)
    _one_report(trainer)
    result = trainer.train()
    trainer.accelerator.wait_for_everyone()
    if trainer.accelerator.is_main_process:  # one writer under `accelerate launch`
        model = trainer.accelerator.unwrap_model(trainer.model)
        model = model.merge_and_unload() if hasattr(model, "merge_and_unload") else model
        model.save_pretrained(out_dir, safe_serialization=True)
        tok.save_pretrained(out_dir)
    return {"train/loss": float(result.training_loss)}


@TRAINERS.named("reward-model")
def train_reward_model(model_path: str, data: dict, out_dir: str | Path, *, lr: float,
                       epochs: float, batch_size: int, max_length: int, seed: int,
                       max_steps: int = -1, log=None, gradient_checkpointing: bool = False,
                       eval_fraction: float = 0.0) -> dict:
    """Pairwise (Bradley-Terry) reward model on prompt/chosen/rejected pairs (`data`:
    `DataConfig.reading("prefs")`); with `eval_fraction`, the pairwise accuracy on pairs held out
    of training, as TRL's RewardTrainer measures it (`eval/pairwise_accuracy`)."""
    from datasets import Dataset
    from trl import RewardConfig, RewardTrainer

    from hindsight.models.load import load_reward_model, load_tokenizer

    rows = [{k: r[k] for k in ("prompt", "chosen", "rejected")} for r in load_rows(**data)]
    rows, held_out = held_out_split(rows, eval_fraction, seed)
    dataset = Dataset.from_list(rows).shuffle(seed=seed)
    tok = load_tokenizer(model_path)
    from transformers import set_seed

    set_seed(seed)  # the new score head: the same init in every run and on every rank
    model = load_reward_model(model_path)
    model.config.pad_token_id = tok.pad_token_id
    args = RewardConfig(
        output_dir=str(out_dir) + ".trainer", learning_rate=lr, num_train_epochs=epochs,
        max_steps=max_steps, per_device_train_batch_size=_per_device(batch_size), max_length=max_length,
        seed=seed, data_seed=seed, report_to="none", save_strategy="no", logging_steps=10,
        per_device_eval_batch_size=EVAL_BATCH, disable_tqdm=True, **_SAME_BATCHES, **_precision(),
        **_checkpointing(gradient_checkpointing),
    )
    trainer = RewardTrainer(model=model, args=args, train_dataset=dataset, processing_class=tok,
                            callbacks=[_metric_callback(log, "reward-model")] if log else None)
    _one_report(trainer)
    result = trainer.train()
    metrics = {"train/loss": float(result.training_loss)}
    if held_out:
        measured = trainer.evaluate(eval_dataset=Dataset.from_list(held_out))
        metrics.update({"eval/pairwise_accuracy": float(measured["eval_accuracy"]), "eval/pairs": float(len(held_out)),
                        "eval/loss": float(measured["eval_loss"])})
    trainer.accelerator.wait_for_everyone()
    if trainer.accelerator.is_main_process:
        trainer.accelerator.unwrap_model(trainer.model).save_pretrained(out_dir, safe_serialization=True)
        tok.save_pretrained(out_dir)
    return metrics


EVAL_BATCH = 8  # TRL averages the accuracy of each eval batch: whole batches make that the pairwise accuracy


def held_out_split(rows: list[dict], fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, held out): a seeded choice of whole eval batches, never trained on."""
    import random

    n = int(len(rows) * fraction) // EVAL_BATCH * EVAL_BATCH
    if fraction and n == 0:
        raise ValueError(f"reward_model.eval_fraction {fraction} of {len(rows)} pairs holds out fewer than "
                         f"{EVAL_BATCH} pairs: add pairs or set it to 0")
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    held = set(order[:n])
    return [r for i, r in enumerate(rows) if i not in held], [rows[i] for i in sorted(held)]


NEAR_CHANCE = 0.05  # a held-out accuracy within this of 0.5 is warned about


def chance_warning(metrics: dict) -> str | None:
    """A reward model that learned nothing (loss near ln 2) otherwise looks like one that did."""
    accuracy = metrics.get("eval/pairwise_accuracy")
    if accuracy is None or abs(accuracy - 0.5) > NEAR_CHANCE:
        return None
    return (f"reward model: pairwise accuracy {accuracy:.3f} on {metrics['eval/pairs']:.0f} held-out pairs is near "
            f"chance (0.5): it may have learned nothing (train loss {metrics['train/loss']:.3f}; ln 2 = 0.693). "
            f"Train longer, raise the lr, or check the pairs")


def _per_device(batch_size: int) -> int:
    """`batch_size` is the global batch; under `accelerate launch` each process takes its share."""
    from hindsight.trainers.launch import world_size

    n = world_size()
    if batch_size % n:
        raise ValueError(f"batch_size {batch_size} does not divide over {n} processes")
    return batch_size // n


def _precision() -> dict:
    """TRL's configs default to bf16 autocast, also on CPU. There it rounds every matmul to
    bf16, so a 2-process run's gradients differed from a 1-process run's by ~0.2% (different
    shapes round differently) and the reward model's weights drifted apart. Training on CPU is
    fp32; on a GPU TRL's default (bf16 where supported) stands."""
    return {} if _has_cuda() else {"use_cpu": True, "bf16": False}


def _checkpointing(on: bool) -> dict:
    """Activation checkpointing by the installed transformers' name for it (TRL's configs turn the
    old name on by default, which also warns on 5.20+); non-reentrant, as RL's learner uses it."""
    from hindsight.models.compat import checkpointing_args

    return checkpointing_args(on)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _one_report(trainer) -> None:
    """With its bar off, the Trainer prints each log as a dict (PrinterCallback); the metric
    callback already reports every logging step as one line, and sends it to MLflow."""
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)


def _metric_callback(log, label: str):
    return _metric_callback_class()(log, label)


@lru_cache(maxsize=None)
def _metric_callback_class():
    """Built on first use: transformers' trainer modules take seconds to import, and a cached
    rerun, which imports this module with every stage's flow, trains nothing."""
    from transformers import TrainerCallback

    class MetricCallback(TrainerCallback):
        """Forward the trainer's log lines to our metric sink (MLflow in tasks/), step by step,
        and show progress (a rich bar on a terminal, a line per log otherwise)."""

        def __init__(self, log, label: str = "train"):
            self.log, self.label, self.progress = log, label, None

        def on_train_begin(self, args, state, control, **kwargs):
            from hindsight.progress import StepProgress

            self.progress = StepProgress(self.label, state.max_steps)

        def on_log(self, args, state, control, logs=None, **kwargs):
            numeric = {f"train/{k}": float(v) for k, v in (logs or {}).items() if isinstance(v, (int, float))}
            if numeric:
                self.log(numeric, state.global_step)
                if self.progress is not None and "train/loss" in numeric:
                    self.progress.advance(state.global_step, f"loss {numeric['train/loss']:.4f}")

        def on_train_end(self, args, state, control, **kwargs):
            if self.progress is not None:
                self.progress.close()

    return MetricCallback
