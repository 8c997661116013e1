"""What a run command prints when it ends: the summary table, what a cached stage is, and
where to look in MLflow."""
from __future__ import annotations

import typer


def print_summary(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="hindsight summary")
    for col in ("stage", "wall time", "eval/accuracy", "registered", "cached"):
        table.add_column(col)
    for r in rows:
        acc = r.get("eval/accuracy")
        table.add_row(r["stage"], f"{r['wall_s']:.1f}s", "-" if acc is None else f"{acc:.3f}",
                      f"{r['model']} v{r['version']}", "yes" if r.get("cached") else "no")
    Console(width=120).print(table)


def where_to_look(cfg) -> None:
    """The MLflow UI link for these runs, in its model-training view (see tracking/store.py)."""
    from tracking import client, experiment_id, tracking_uri, ui_url

    uri = tracking_uri(cfg)
    try:
        exp = experiment_id(client(cfg), cfg)
    except Exception:  # only a pointer; the registry may be unreachable
        return
    if uri.startswith(("http://", "https://")):
        typer.echo(f"MLflow: {ui_url(uri, exp)}")
    else:
        typer.echo(f"MLflow: `mlflow ui --backend-store-uri {uri}`, then {ui_url('http://127.0.0.1:5000', exp)}")


def explain_cached(cfg, rows: list[dict]) -> None:
    """A cached stage registered nothing now: say which earlier version it is, and when a
    later version holds @latest, that it is not the one this config produced."""
    from tracking import client

    for r in rows:
        if not r.get("cached"):
            continue
        try:
            latest = client(cfg).get_model_version_by_alias(r["model"], "latest").version
        except Exception:  # the registry is only asked to explain; it may be unreachable
            latest = None
        note = f"{r['stage']}: cached, so nothing was trained or registered now: {r['model']} v{r['version']} is the " \
               f"version an earlier run registered for these same inputs (MLflow run {r['run_id']})"
        if latest is not None and str(latest) != str(r["version"]):
            note += f"; @latest is v{latest}, registered since by other inputs"
        typer.echo(note)
