"""Models.

Loading policies, references, reward models and LoRA adapters by hub id or path (and on the
meta device, for a sharded start), exporting a trained policy, and the tiny models built in code.
"""
