"""A learner rank lost mid-stage (issue 47), recovered in the same attempt: the group is torn
down and built again from the newest checkpoint (each rank loads its shard, or the replicated
state), then the stored steps since that checkpoint are trained again from the rollout store,
in order, and the step that failed is trained. The ledger is untouched: the weights that held
those steps were lost with the group, so the rebuilt ones hold each of them once.

Prefect's retry of the whole stage stays the last resort: past `rl.workers.replacements`
rebuilds, or when the group cannot be placed again, the stage fails with the reason."""
from __future__ import annotations

import json
import time

from hindsight.console import say
from hindsight.coordination.learner_group import start_learner_group
from hindsight.errors import StageError
from hindsight.fsutil import append_line
from hindsight.learning.learner import Learner, PeerLost


def rebuild_learner(run, step: int, lost: PeerLost) -> list[int]:
    """Replace `run.learner` by a new group at the newest checkpoint and train the stored steps
    from there up to `step` (not included); returns those steps."""
    limit = run.rl.workers.replacements
    if run.learner_rebuilds >= limit:
        raise StageError(f"step {step}: {lost}, and the learner group was rebuilt {run.learner_rebuilds} times "
                         f"already (rl.workers.replacements {limit}); rerun to resume from the newest checkpoint"
                         ) from lost
    run.learner_rebuilds += 1
    run.watchdog.progress()  # rebuilding and replaying is the update phase moving on, not stalling
    t0, start, fit = time.perf_counter(), run.ckpt.intact_step(), run.learner.budget_fit
    run.learner.close()  # the broken process group, and the peers still alive
    pad_id = run.tok.pad_token_id
    try:
        run.learner = Learner(run.given_cfg, run.init_path, run.rm_path, run.ckpt, start, pad_id,
                              start_group=start_learner_group(run.given_cfg, pad_id, run.init_path, bool(start)))
    except Exception as exc:  # no room for a new rank, say: fail as before, with both reasons
        raise StageError(f"step {step}: {lost}; the learner group could not be rebuilt: {exc}") from exc
    if fit is not None:  # the micro-batches the run had (a fit is a collective over the new group)
        run.learner.fit_budget(fit["width"], 0, fit)  # the same rows, should the cap have moved
    entropy = run.ckpt.manifest().get("entropy_control") if start else None
    if entropy is not None:
        run.learner.restore_entropy(entropy)
    run.set_lr()  # rl.learner.lr with the alerts' cuts so far
    replayed = list(range(start or 0, step))
    for s in replayed:
        run.watchdog.progress()
        run.train_stored(s)
    event = {"time": time.time(), "step": step, "role": "learner", "worker": "learner group", "why": str(lost),
             "checkpoint": start or 0, "replayed": replayed, "seconds": round(time.perf_counter() - t0, 3),
             "replacement": "a new group"}
    append_line(run.paths.workers_log, json.dumps(event))
    say(f"rl: step {step}: {lost}; the learner group was rebuilt from step {start or 0}'s checkpoint and trained "
        f"steps {replayed} again ({run.learner_rebuilds} of rl.workers.replacements {limit})")
    return replayed
