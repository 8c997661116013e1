"""Worker pools: where the RL run's rollout workers and scorers run, one file each, behind one
contract (`base.WorkerPool`), registered in `hindsight.rollout.pools.POOLS` and chosen by
`rl.workers.placement`."""
from __future__ import annotations

from hindsight.coordination.pools.base import PoolContext, WorkerPool
from hindsight.rollout.pools import POOLS, pool_name


def build_pool(ctx: PoolContext) -> WorkerPool:
    """The run's pool, built: its workers placed and holding weights version `ctx.version`."""
    return POOLS.lookup(pool_name(ctx.cfg.rl))(ctx)
