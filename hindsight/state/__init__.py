"""State on disk.

The rollout store, the group ledger, checkpoints, the run fingerprint, the run lock and atomic
file writes.
"""
