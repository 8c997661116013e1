"""State on disk.

The run directory as one object (`rundir`), the rollout store, the group ledger, checkpoints,
the run fingerprint, the run lock and atomic file writes.
"""
