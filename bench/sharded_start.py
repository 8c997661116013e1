"""A sharded learner rank's host memory at start: P = 2 against P = 1, measured side by side.

    python bench/sharded_start.py [--hidden 512 --layers 16 --vocab 8000]

A Qwen2 model built from its config and saved as safetensors (65 M parameters, 260 MB in fp32,
tied embeddings) is started by `rl.learner.strategy: fsdp2` ranks over gloo, each in a fresh
process: the meta-device start (`learning.strategies.meta_start`: build on meta, shard, read
only this rank's slices), and, for contrast, the full build before sharding that each rank used
to do. A rank's start peak is its resident peak during the start (VmHWM, reset first) minus its
resident memory just before it: what starting the model costs, not the interpreter's own.
Then every rank runs a forward (a collective) and compares the logits with `from_pretrained`'s,
bit for bit.

The last line is `ratio start_rss fsdp2 P2/P1: Z` (meta-device start, the larger rank).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MALLOC = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}  # freed tensors go back at once


def _kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(key)


def save_model(folder: Path, hidden: int, layers: int, vocab: int) -> str:
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM  # noqa: F401

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 4, num_hidden_layers=layers,
                      num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True)
    Qwen2ForCausalLM(cfg).save_pretrained(folder, safe_serialization=True)
    return str(folder)


def rank_main(spec: dict) -> dict:
    """One rank: start the model (meta or full), measure, then check its logits."""
    import torch

    from hindsight.config import PipelineConfig
    from hindsight.learning.build import build_policy
    from hindsight.learning.strategies.sharded import Sharded, shard
    from hindsight.models.load import load_causal_lm

    torch.set_num_threads(1)
    cfg = PipelineConfig.model_validate({"rl": {"learner": {"strategy": "fsdp2"}}})
    strategy = Sharded(spec["rank"], spec["world"], cfg.rl.learner)
    strategy.join(spec["init"], 120)
    make = partial(build_policy, model_cfg=cfg.model, rl=cfg.rl)
    _warm(spec["path"])
    Path("/proc/self/clear_refs").write_text("5")
    before = _kb("VmRSS")
    model = strategy.build(make, spec["path"]) if spec["mode"] == "meta" else shard(make(spec["path"]))
    peak_mb = (_kb("VmHWM") - before) / 1024
    ids = torch.arange(spec["vocab"] - 40, spec["vocab"] - 1).view(3, 13) % spec["vocab"]
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    reference = load_causal_lm(spec["path"])
    with torch.no_grad():
        same = bool(torch.equal(logits, reference(input_ids=ids).logits))
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    strategy.leave()
    return {**spec, "start_mb": peak_mb, "bit_equal": same, "tied": tied,
            "params_m": sum(p.numel() for p in reference.parameters()) / 1e6}


def _warm(path: str) -> None:
    """Import what the first build imports (the model's code, FSDP, accelerate, safetensors), so
    the measured peak is the model's and not the modules'."""
    import accelerate  # noqa: F401
    import safetensors.torch  # noqa: F401
    import torch.distributed.checkpoint  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    with init_empty_weights():
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))


def group(path: str, world: int, mode: str, vocab: int) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        init = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    env = {**os.environ, **MALLOC}
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", json.dumps(
        {"rank": r, "world": world, "init": init, "path": path, "mode": mode, "vocab": vocab})],
        stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env) for r in range(world)]
    out = [p.communicate()[0].strip().splitlines() for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"a rank failed: {[p.returncode for p in procs]}")
    return [json.loads(lines[-1]) for lines in out]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", help=argparse.SUPPRESS)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--dir", default=None, help="where to save the model (default a temporary folder)")
    args = ap.parse_args()
    if args.rank:
        print(json.dumps(rank_main(json.loads(args.rank))))
        return
    import tempfile

    folder = Path(args.dir or tempfile.mkdtemp(prefix="sharded-start-")) / "model"
    path = save_model(folder, args.hidden, args.layers, args.vocab)
    rows = {(mode, world): group(path, world, mode, args.vocab) for mode in ("meta", "full") for world in (1, 2)}
    print(f"model: Qwen2 hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}, "
          f"{rows['meta', 1][0]['params_m']:.1f} M parameters (fp32)")
    for (mode, world), ranks in rows.items():
        for r in ranks:
            print(f"  {mode:<4} P={world} rank {r['rank']}: start peak {r['start_mb']:7.1f} MB  logits bit-equal to "
                  f"from_pretrained: {r['bit_equal']}  tied weights tied: {r['tied']}", flush=True)
    ratio = {mode: max(r["start_mb"] for r in rows[mode, 2]) / rows[mode, 1][0]["start_mb"] for mode in ("meta", "full")}
    print(f"ratio start_rss full-build fsdp2 P2/P1: {ratio['full']:.2f}")
    print(f"ratio start_rss fsdp2 P2/P1: {ratio['meta']:.2f}")


if __name__ == "__main__":
    main()
