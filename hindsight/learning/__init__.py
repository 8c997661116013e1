"""The learner.

The algorithms, the policy update, the critic, the learner group (replicated or FSDP2-sharded,
`sharding`), and the SFT / reward-model / negative-ft trainers.
"""
