"""The tiny demo model and its tokenizer, built in code: tests and the demo need no download."""
from __future__ import annotations

import os
from pathlib import Path

import torch

DEMO_SPECIAL = {"pad": "<pad>", "eos": "<eos>", "bos": "<bos>", "unk": "<unk>"}


def build_demo_tokenizer():
    """A small byte-level BPE trained in code on the demo's vocabulary: no download.

    Byte-level means any text still encodes; digits are split one per token, so the answer
    to an arithmetic problem is a few tokens the policy must each get right.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from hindsight.data.demo import ITEMS, NAMES, VERBS

    core = Tokenizer(models.BPE(unk_token=None))
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    core.decoder = decoders.ByteLevel()
    words = NAMES + ITEMS + VERBS + ["has", "and", "more", "How", "many", "now", "A", "Q"]
    corpus = [" ".join(words)] * 4 + [f"{w} {w}." for w in words]
    trainer = trainers.BpeTrainer(vocab_size=384, special_tokens=list(DEMO_SPECIAL.values()),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    core.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=DEMO_SPECIAL["pad"],
        eos_token=DEMO_SPECIAL["eos"],
        bos_token=DEMO_SPECIAL["bos"],
        unk_token=DEMO_SPECIAL["unk"],
    )


def build_tiny_model(out_dir: str | Path, hidden: int = 128, layers: int = 4, heads: int = 4,
                     seed: int = 0) -> Path:
    """Write a randomly initialised Llama-style causal LM plus tokenizer in HF format."""
    from transformers import LlamaConfig, LlamaForCausalLM

    out_dir = Path(out_dir)
    tok = build_demo_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 4,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
        max_position_embeddings=256, tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    os.replace(tmp, out_dir) if not out_dir.exists() else None
    return out_dir
