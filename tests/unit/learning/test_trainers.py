"""SFT through TRL with LoRA (peft): the adapter is merged, and the saved model loads plainly."""
import torch

from hindsight.config import DataConfig, LoraConfig
from hindsight.data.demo import build_demo_data
from hindsight.models.load import load_causal_lm
from hindsight.models.tiny import build_tiny_model
from hindsight.learning.trainers import train_sft


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
