"""SFT through TRL with LoRA (peft): the adapter is merged, and the saved model loads plainly."""
import torch

from hindsight.config import DataConfig, LoraConfig
from hindsight.data.demo import build_demo_data
from hindsight.models.load import load_causal_lm
from hindsight.models.tiny import build_tiny_model
from hindsight.trainers.supervised import train_sft


def test_sft_with_lora_merges_into_a_plain_checkpoint(tmp_path):
    base = build_tiny_model(tmp_path / "base", hidden=32, layers=1, heads=2)
    files = build_demo_data(tmp_path / "data", n_prompts=4, n_eval=4, n_sft=64, n_prefs=4)
    out = tmp_path / "sft"
    logged = []
    data = DataConfig(sft=str(files["sft.jsonl"])).reading("sft")
    train_sft(str(base), data, out, lr=1e-2, epochs=1, batch_size=16, max_length=48, seed=0,
              lora=LoraConfig(enabled=True, r=4, alpha=8, target_modules=["q_proj", "v_proj"]), max_steps=3,
              log=lambda m, step: logged.append(step))
    tuned, orig = load_causal_lm(str(out)), load_causal_lm(str(base))
    assert not (out / "adapter_config.json").exists()  # merged: later stages need no peft
    q_tuned = tuned.model.layers[0].self_attn.q_proj.weight
    q_orig = orig.model.layers[0].self_attn.q_proj.weight
    assert not torch.allclose(q_tuned, q_orig)  # LoRA changed the attention weights
    k_tuned, k_orig = tuned.model.layers[0].self_attn.k_proj.weight, orig.model.layers[0].self_attn.k_proj.weight
    assert torch.equal(k_tuned, k_orig)  # ... and only the targeted ones


def test_the_reward_model_reports_pairwise_accuracy_on_pairs_it_never_trained_on(tmp_path):
    """TRL's RewardTrainer measures the held-out accuracy; checked here against scoring each held-out
    pair by hand with the saved model (TRL's tokenisation: prompt + text + eos)."""
    from hindsight.trainers.supervised import held_out_split, train_reward_model
    from hindsight.models.load import load_reward_model, load_tokenizer

    base = build_tiny_model(tmp_path / "base", hidden=32, layers=1, heads=2)
    files = build_demo_data(tmp_path / "data", n_prompts=4, n_eval=4, n_sft=4, n_prefs=160)
    data = DataConfig(prefs=str(files["prefs.jsonl"])).reading("prefs")
    out = train_reward_model(str(base), data, tmp_path / "rm", lr=3e-3, epochs=1, batch_size=16, max_length=64,
                             seed=0, max_steps=6, eval_fraction=0.2)
    from hindsight.data.rows import load_rows

    rows = [{k: r[k] for k in ("prompt", "chosen", "rejected")} for r in load_rows(**data)]
    train, held = held_out_split(rows, 0.2, seed=0)
    assert len(held) == 32 and len(train) == 128
    assert out["eval/pairs"] == 32.0
    model, tok = load_reward_model(str(tmp_path / "rm")).eval(), load_tokenizer(str(tmp_path / "rm"))

    def score(text):
        with torch.no_grad():
            return model(input_ids=torch.tensor([tok(text + tok.eos_token)["input_ids"]])).logits[0, 0].item()

    by_hand = sum(score(r["prompt"] + r["chosen"]) > score(r["prompt"] + r["rejected"]) for r in held) / len(held)
    assert abs(out["eval/pairwise_accuracy"] - by_hand) < 1e-6
    assert held_out_split(rows, 0.2, seed=0) == (train, held)  # the same pairs every run


def test_a_reward_model_near_chance_is_warned_about():
    from hindsight.trainers.supervised import chance_warning

    warning = chance_warning({"eval/pairwise_accuracy": 0.53, "eval/pairs": 200.0, "train/loss": 0.69})
    assert warning.startswith("reward model: pairwise accuracy 0.530 on 200 held-out pairs is near chance (0.5)")
    assert chance_warning({"eval/pairwise_accuracy": 0.9, "eval/pairs": 200.0, "train/loss": 0.2}) is None
    assert chance_warning({"train/loss": 0.69}) is None  # nothing held out: nothing to say
