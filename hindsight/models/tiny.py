"""Tiny models and tokenizers built in code, so tests and the demo need no download: the demo's
Llama-style model (`tiny://demo`) and a Qwen2-architecture one with a real `Qwen2Tokenizer` and a
ChatML chat template (`tiny://qwen2`), saved in Hugging Face format like a user's own model."""
from __future__ import annotations

import os
from pathlib import Path

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
    import torch  # here, not at import: resolving tiny://NAME to a built folder needs no torch

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


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


# Qwen2.5's tool-calling template without its default system prompt: the same text as CHATML for
# a conversation without tools, the tools' schemas in the system turn, calls as <tool_call> JSON
# and results as <tool_response> blocks in a user turn.
TOOLS_CHATML = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0]['role'] == 'system' %}"
    "{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, "
    "\\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'user' or message.role == 'system' or (message.role == 'assistant' "
    "and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}"
    "{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\\\"name\\\": \\\"' + tool_call.name + '\\\", \\\"arguments\\\": ' }}"
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def _tool_boilerplate() -> str:
    """What a tool conversation repeats: the template's tools header, a schema, a call, a result."""
    from jinja2 import Template

    schema = {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "description": "The first number."},
                                         "b": {"type": "integer", "description": "The second number."}},
        "required": ["a", "b"]}, "return": {"type": "integer"}}}
    import json

    messages = [{"role": "user", "content": "What is 1 + 2?"},
                {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "add",
                                                                                  "arguments": {"a": 1, "b": 2}}}]},
                {"role": "tool", "content": "3"}]
    text = Template(TOOLS_CHATML).render(messages=messages, tools=[schema], add_generation_prompt=True)
    return text.replace("<|im_start|>", " ").replace("<|im_end|>", " ") + json.dumps(schema)


def build_chatml_tokenizer(tools: bool = False):
    """A byte-level BPE on the demo's words in transformers' own `Qwen2Tokenizer` (its pre-tokenizer
    splits digits, as Qwen's does), with `<|endoftext|>` as eos and pad, `<|im_start|>` and
    `<|im_end|>`, and Qwen's ChatML template: it reloads as the same class with the same ids."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    from hindsight.data.demo import ITEMS, NAMES, VERBS

    core = Tokenizer(models.BPE(unk_token=None))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    words = NAMES + ITEMS + VERBS + ["has", "and", "more", "How", "many", "now", "A", "Q", "user", "assistant"]
    corpus = [" ".join(words)] * 4 + [f"{w} {w}." for w in words] + ["0 1 2 3 4 5 6 7 8 9 ####"]
    if tools:  # the template's tool boilerplate and call JSON in the corpus: a few tokens each, not bytes
        corpus += [_tool_boilerplate()] * 8
    trainer = trainers.BpeTrainer(vocab_size=1000 if tools else 400, special_tokens=[], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(corpus, trainer=trainer)
    model = json.loads(core.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    tok = Qwen2Tokenizer(vocab=model["vocab"], merges=merges)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    if tools:  # as in Qwen2.5: added tokens, not special ones (decoding keeps them)
        tok.add_tokens(["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"])
    tok.chat_template = TOOLS_CHATML if tools else CHATML
    return tok


def build_tiny_qwen2(out_dir: str | Path, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                     seed: int = 0, tools: bool = False) -> Path:
    """Write a randomly initialised `Qwen2ForCausalLM`, its ChatML tokenizer and a Qwen-style
    generation config (both end tokens, a repetition penalty) in Hugging Face format."""
    import torch  # here, not at import: resolving tiny://NAME to a built folder needs no torch

    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    out_dir = Path(out_dir)
    tok = build_chatml_tokenizer(tools)
    end, im_end = tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    config = Qwen2Config(vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 4, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=512,
                         tie_word_embeddings=True, pad_token_id=end, eos_token_id=end, bos_token_id=None)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=[im_end, end], pad_token_id=end, bos_token_id=None,
                                               repetition_penalty=1.05, do_sample=True, temperature=0.7, top_p=0.8)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    os.replace(tmp, out_dir) if not out_dir.exists() else None
    return out_dir


def build_tiny_qwen2_tools(out_dir: str | Path) -> Path:
    """`tiny://qwen2-tools`: tiny Qwen2 with Qwen2.5's tool-calling chat template (a wider and
    deeper one, 128 x 4, copied operands no better after 4 SFT epochs: docs/status.md)."""
    return build_tiny_qwen2(out_dir, hidden=64, layers=2, tools=True)


def build_tiny_qwen2_tools_h32(out_dir: str | Path) -> Path:
    """`tiny://qwen2-tools-h32`: the same with two query heads over one key/value head, a head size
    of 32, the smallest vLLM's CPU attention takes: the multi-turn demos on `rl.rollout.backend: vllm`."""
    return build_tiny_qwen2(out_dir, hidden=64, layers=2, heads=2, kv_heads=1, tools=True)


TINY = {"demo": build_tiny_model, "qwen2": build_tiny_qwen2, "qwen2-tools": build_tiny_qwen2_tools,
        "qwen2-tools-h32": build_tiny_qwen2_tools_h32}  # tiny://NAME


def build_tiny_judge(out_dir: str | Path, answer: str = "score: 1", steps: int = 150, seed: int = 0,
                     examples=None, heads: int = 4, kv_heads: int = 2) -> Path:
    """A tiny Qwen2 judge for tests and the judge benchmark: trained in code (seconds) to answer
    every chat prompt with `answer` and end its turn, so that it can be served (`transformers
    serve`) and parsed like a real judge model. `examples(rng) -> (prompt, answer)` gives it
    prompts and answers of its own instead (a judge taught to tell two kinds apart). `heads=2,
    kv_heads=1` gives heads of 32, what `vllm serve` on a CPU needs."""
    import torch  # here, not at import: resolving tiny://NAME to a built folder needs no torch

    import random

    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from hindsight.data.demo import ITEMS, NAMES

    out_dir = Path(out_dir)
    base = build_tiny_qwen2(out_dir.with_name(out_dir.name + ".base"), seed=seed, heads=heads, kv_heads=kv_heads)
    tok, model = AutoTokenizer.from_pretrained(base), Qwen2ForCausalLM.from_pretrained(base)
    rng, opt = random.Random(seed), torch.optim.AdamW(model.parameters(), lr=3e-3)
    if examples is None:
        def examples(r):
            return " ".join(r.choice(NAMES + ITEMS) for _ in range(r.randrange(3, 40))), answer
    torch.manual_seed(seed)
    for _ in range(steps):
        rows = []
        for _ in range(16):
            words, said = examples(rng)
            target = tok(said + "<|im_end|>", add_special_tokens=False)["input_ids"]
            prompt = tok.apply_chat_template([{"role": "user", "content": words}], add_generation_prompt=True,
                                             return_dict=False)
            rows.append((prompt, prompt + target))
        width = max(len(full) for _, full in rows)
        ids = torch.tensor([full + [tok.pad_token_id] * (width - len(full)) for _, full in rows])      # (16, L)
        labels = torch.tensor([[-100] * len(p) + f[len(p):] + [-100] * (width - len(f)) for p, f in rows])  # (16, L)
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    os.replace(tmp, out_dir) if not out_dir.exists() else None
    return out_dir


def teach_short_turns(model, tok, steps: int = 40, seed: int = 0):
    """Teach a tiny chat model, in a few seconds, to answer a user turn with one digit and end its
    turn: a random model almost never samples `<|im_end|>`, and a multi-turn rollout needs turns
    that end (tests and benches of the multi-turn loop). Returns the model."""
    import torch

    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    for step in range(steps):
        seqs = []
        for i in range(8):
            prompt = tok.apply_chat_template([{"role": "user", "content": f"Round {step * 8 + i}"}],
                                             add_generation_prompt=True, return_dict=False)
            seqs.append((prompt, tok(str(i % 10), add_special_tokens=False)["input_ids"] + [end]))
        width = max(len(p) + len(a) for p, a in seqs)
        ids = torch.tensor([p + a + [tok.pad_token_id] * (width - len(p) - len(a)) for p, a in seqs])        # (8, L)
        labels = torch.tensor([[-100] * len(p) + a + [-100] * (width - len(p) - len(a)) for p, a in seqs])  # (8, L)
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model
