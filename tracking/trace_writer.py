"""The trace writer: a process of its own that turns stored steps into MLflow traces.

Writing a trace is Python work in MLflow's SQL store (~4.5 ms of CPU a trace and ~15 ms a step's
`log_spans`); on a thread of the training process it held the interpreter the decode loop needs
(the demo's step took 1.49x as long with 8 traces a step). A child process at the step's priority
was no better on 2 cores (1.57x): its CPU stalled the step's intra-op threads. So a child process
at the lowest priority does it, in the step's gaps (bench/traces.py: 1.00x):

- the stage queues one JSON line per job (`step`: a step number and where its shards are; `eval`:
  an evaluation's answers) and goes on; a feeder thread writes it to the child's stdin, so a full
  pipe never blocks a step;
- the child reads the shards, builds the records (`hindsight.lookback.traces`) and sends them
  (`tracking.trace_send`), in order;
- a batch that meets an MLflow outage comes back to the stage as a `spool` line, and the stage
  spools it like any other write (one process appends to the spool);
- `flush` waits until every job sent so far is done (a run's end waits for its traces).

If the child cannot start or dies, the jobs run on the tracking writer thread instead, as before.
"""
from __future__ import annotations

import json
import logging
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

log = logging.getLogger("hindsight.tracking")
FLUSH_TIMEOUT_S = 600.0


class TraceProcess:
    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()
        self.done = threading.Condition()
        self.sent = self.acked = 0
        self.broken = False
        self.jobs: queue.Queue[dict] = queue.Queue()

    def send(self, job: dict) -> bool:
        """Hand a job to the child (started on first use); False when there is no child to take it.
        The pipe is fed by a thread of its own, so a step never blocks on a full pipe while a
        low-priority child catches up."""
        with self.lock:
            if self.broken:
                return False
            if self.proc is None:
                try:
                    self._start()
                except OSError as exc:
                    self._lost(exc)
                    return False
            self.jobs.put(job)
            return True

    def flush(self, timeout: float = FLUSH_TIMEOUT_S) -> None:
        """Wait until the child has done every job sent before this call."""
        with self.lock:
            if self.proc is None or self.broken:
                return
            self.sent += 1
            mark = self.sent
            self.jobs.put({"kind": "flush", "id": mark})
        with self.done:
            if not self.done.wait_for(lambda: self.acked >= mark or self.broken, timeout):
                log.warning("the trace writer did not finish within %.0f s; its remaining traces are not written",
                            timeout)

    def _feed(self, proc: subprocess.Popen) -> None:
        while True:
            job = self.jobs.get()
            try:
                proc.stdin.write(json.dumps(job) + "\n")
                proc.stdin.flush()
            except (OSError, ValueError) as exc:
                with self.lock:
                    self._lost(exc)
                return

    def _start(self) -> None:
        here = str(Path(__file__).resolve().parents[1])  # where `tracking` and `hindsight` import from
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}
        # `-c`, not `-m`: `tracking` imports this module, and runpy warns when `-m` runs one already imported
        entry = "from tracking.trace_writer import main; main()"
        self.proc = subprocess.Popen([sys.executable, "-c", entry], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, bufsize=1)
        threading.Thread(target=self._read, args=(self.proc,), daemon=True, name="hindsight-traces-reader").start()
        threading.Thread(target=self._feed, args=(self.proc,), daemon=True, name="hindsight-traces-feeder").start()

    def _read(self, proc: subprocess.Popen) -> None:
        from tracking.spool import OUTAGE, Spool

        for line in proc.stdout:
            msg = json.loads(line)
            if "flushed" in msg:
                with self.done:
                    self.acked = max(self.acked, msg["flushed"])
                    self.done.notify_all()
            elif "spool" in msg:  # an outage: the stage's own spool keeps the batch
                job = msg["spool"]
                spool = Spool(job["root"])
                OUTAGE.went_down(job["uri"], spool, ConnectionError(msg.get("error", "unreachable")))
                spool.add("traces", job["uri"], job["run_id"], records=job["records"])
        with self.lock:
            self._lost(RuntimeError(f"the trace writer exited ({proc.wait()})"))

    def _lost(self, exc: BaseException) -> None:
        if not self.broken:
            log.warning("the trace writer process is gone (%s); traces are written on the tracking thread", exc)
        self.broken = True
        with self.done:
            self.done.notify_all()


PROCESS = TraceProcess()


def records_of(job: dict) -> list[dict]:
    """The trace records a job names: a stored step's trajectories, or an evaluation's answers."""
    from hindsight.lookback.traces import eval_records, step_records
    from hindsight.rollout.seeds import group_seed
    from hindsight.state.store import RolloutStore

    if job["kind"] == "eval":
        return eval_records(job["answers"], job["step"], job["run_id"], job["budget"])
    store, shard = RolloutStore(job["rl_dir"]), job["step"] - 1
    if not (store.has("rollouts", shard) and store.has("scores", shard)):
        return []
    adv = {a["index"]: a["advantage"] for a in store.read("advantages", shard)} if store.has("advantages", shard) else {}
    report = f"reports/step-{job['step']:06d}.html (or: hindsight report {job['run_id']} --step {job['step']})"
    return step_records(store.read("rollouts", shard), store.read("scores", shard), adv, job["step"], job["run_id"],
                        lambda g: group_seed(job["seed"], shard, g), job["budget"], report)


def _yield_the_cores() -> None:
    """The lowest CPU priority, and one thread for Arrow's reads: on a machine whose cores the step's
    intra-op threads fill, the writer then runs in the step's gaps (its Python between kernels, the
    decode loop's sampling) instead of stalling a parallel region that waits for its slowest thread."""
    try:
        os.nice(19)
    except OSError:  # a platform without nice: the writer still works, at the step's priority
        pass
    import pyarrow

    pyarrow.set_cpu_count(1)
    pyarrow.set_io_thread_count(1)


def main() -> None:
    """The child: jobs in on stdin, `flushed` and `spool` lines out on stdout, warnings on stderr."""
    from mlflow.tracking import MlflowClient

    from hindsight.lookback.traces import redact, secret_values
    from tracking.spool import unreachable
    from tracking.trace_send import send_records

    _yield_the_cores()
    experiments: dict[tuple[str, str], str] = {}
    secrets = secret_values()
    for line in sys.stdin:
        job = json.loads(line)
        if job["kind"] == "flush":
            print(json.dumps({"flushed": job["id"]}), flush=True)
            continue
        records = []
        try:
            records = redact(records_of(job), secrets)
            if records:
                key = (job["uri"], job["run_id"])
                if key not in experiments:
                    experiments[key] = MlflowClient(job["uri"]).get_run(job["run_id"]).info.experiment_id
                send_records(job["uri"], job["run_id"], records, experiments[key])
        except Exception as exc:
            if unreachable(exc):
                print(json.dumps({"spool": {**{k: job[k] for k in ("root", "uri", "run_id")}, "records": records},
                                  "error": str(exc)[:300]}), flush=True)
            else:
                print(f"hindsight: a trace write failed ({type(exc).__name__}: {str(exc)[:300]}); training goes on "
                      f"without it", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
