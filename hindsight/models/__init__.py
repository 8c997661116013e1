"""Models.

Loading policies, references, reward models and LoRA adapters by hub id or path, and the tiny
demo model built in code.
"""
