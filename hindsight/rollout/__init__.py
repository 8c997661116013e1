"""Generation backends: `hf` (transformers generate, CPU or GPU) and `vllm` (GPU, optional)."""
