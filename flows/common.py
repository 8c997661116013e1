"""What every stage flow does first: make sure the data is there and at its pinned version."""
from __future__ import annotations

import logging
from pathlib import Path

from hindsight.config import PipelineConfig
from hindsight.data import DEMO_FILES, build_demo_data, dvc_dir_md5, pinned_md5
from hindsight.errors import DataError, HindsightError, StageError

log = logging.getLogger("hindsight")


def ensure_data(cfg: PipelineConfig) -> str:
    """Return the data version (DVC md5). Builds the demo data when it is missing.

    A fresh clone has no DVC remote to pull from; the demo data is regenerated
    deterministically and must reproduce the md5 pinned in data.dvc.
    """
    d = cfg.data
    data_dir = Path(d.dir)
    if d.build_demo and not all((data_dir / f).exists() for f in DEMO_FILES):
        log.info("building demo data in %s", data_dir)
        build_demo_data(data_dir, seed=0)
    if d.dvc_file and Path(d.dvc_file).exists() and data_dir.is_dir():
        actual, pinned = dvc_dir_md5(data_dir), pinned_md5(d.dvc_file)
        if actual != pinned:
            raise DataError(f"{data_dir}: md5 {actual} does not match {pinned} pinned in {d.dvc_file} "
                            f"(run `dvc checkout`, or `hindsight data build` for the demo data)")
        return pinned
    return dvc_dir_md5(data_dir) if data_dir.is_dir() else "external"


def sft_uri(cfg: PipelineConfig) -> str:
    return f"models:/{cfg.name}-sft@latest"


def rm_uri(cfg: PipelineConfig) -> str:
    return f"models:/{cfg.name}-rm@latest"


def run_stage(stage: str, task_fn, cfg: PipelineConfig, force: bool):
    """The stage task with the config's retry policy, and `force` as a cache refresh.

    Only unexpected failures are retried: a `HindsightError` is bad input, and would fail
    the same way again. Once retries are spent, the error names the stage and its cause.
    """
    task = task_fn.with_options(retries=cfg.retries.count, retry_delay_seconds=cfg.retries.delay_s,
                                refresh_cache=force, retry_condition_fn=_transient)

    def call(*args):
        try:
            return task(*args)
        except HindsightError as exc:
            raise type(exc)(f"stage {stage}: {exc}") from exc
        except Exception as exc:
            raise StageError(
                f"stage {stage} failed after {cfg.retries.count + 1} attempt(s): {type(exc).__name__}: {exc}. "
                f"Its state under {cfg.root} is kept; rerun the same command to resume (--debug for the traceback)"
            ) from exc

    return call


def _transient(task, task_run, state) -> bool:
    exc = state.data if isinstance(state.data, BaseException) else state.result(raise_on_failure=False)
    return not isinstance(exc, HindsightError)
