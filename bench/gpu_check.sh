#!/usr/bin/env bash
# One short GPU check (about 4-5 minutes on one H200): the vLLM tests of tests/roles as CI runs them
# on vLLM's CPU build, then RL steps of a ~100M model built in code,
# with hf and with vllm rollouts, then vllm with rl.async.max_staleness 0 against 1, the FSDP2
# learner over the visible GPUs (bf16, NCCL), and the vLLM push (outputs change after it). Installs
# nothing from the network: run it where the project and its `.[vllm]` extra are already
# installed. Prints tokens/s per backend, the update's throughput, and for k = 0 and k = 1 the
# step time and the sampled tokens per second of a whole step.
set -euo pipefail
cd "$(dirname "$0")/.."
export PREFECT_SERVER_ANALYTICS_ENABLED=false TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
python -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" \
  || echo "vllm is not importable: the vllm row will show the error"
# the vLLM tests CI runs on vLLM's CPU build, unchanged, on the GPU's vLLM: the push, deltas, the
# check inside the engine, LoRA, the decoding contract, the gap and the turn method
python -m pytest -q -p no:cacheprovider tests/roles/test_vllm_push.py tests/roles/test_vllm_engine.py || true
exec python bench/gpu_check.py
