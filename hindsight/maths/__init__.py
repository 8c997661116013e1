"""Shared model maths, the leaves every role computes with: token log-probs and entropies
(`logprobs`), rows packed end to end (`packing`), per-sample scores and their statistics
(`scores`), and the experience a learner trains on (`experience`). Pure tensor functions, no state."""
