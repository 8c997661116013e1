"""One registry per idea: the stage registry generates the CLI's run commands, the pipeline's order
and prefect.yaml's deployments; a new stage is its flow file plus one entry."""
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cli.commands import build_app
from flows import registry
from hindsight.config import PipelineConfig

ROOT = Path(__file__).resolve().parents[3]


def _deployed(doc: dict) -> list[tuple[str, str, str]]:
    return [(d["name"], d["entrypoint"], d["work_pool"]["name"]) for d in doc["deployments"]]


def test_prefect_yaml_deploys_exactly_what_the_registry_lists():
    doc = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    pools = {"local": "hindsight-local", "k8s": "hindsight-k8s"}
    assert _deployed(doc) == [(d["name"], d["entrypoint"], pools[d["pool"]]) for d in registry.deployments()]
    names = {d["name"] for d in doc["deployments"]}
    for stage in registry.STAGES:  # every stage, negative-ft included, on both pools
        assert {f"{stage.name}-local", f"{stage.name}-k8s"} <= names


def test_every_entry_loads_its_flow_and_declaration():
    for stage in registry.STAGES:
        assert stage.load_flow().name == stage.name
        if stage.spec:
            assert stage.load_spec().name == stage.name


@pytest.fixture
def echo_stage():
    stage = registry.Stage("echo", "tests.unit.flows.echo_stage:echo_flow", "Echo: a test-only stage.",
                           "tests.unit.flows.echo_stage:ECHO", lambda cfg: True)
    registry.register(stage, before="negative-ft")
    yield stage
    registry.unregister("echo")


def test_a_registered_stage_is_a_cli_command_a_pipeline_step_and_a_deployment(echo_stage, tmp_path):
    out = CliRunner().invoke(build_app(), ["run", "--help"], env={"COLUMNS": "160"}).output
    assert "echo" in out and "Echo: a test-only stage." in out
    out = CliRunner().invoke(build_app(), ["run", "echo", "--help"], env={"COLUMNS": "160"}).output
    assert "--config" in out and "--force" in out

    cfg = PipelineConfig.model_validate({"name": "t", "run_dir": str(tmp_path), "negative_ft": {"enabled": True}})
    assert [s.name for s in registry.pipeline_stages(cfg)] == ["sft", "reward-model", "rl", "echo", "negative-ft"]

    deployed = {d["name"]: d["entrypoint"] for d in registry.deployments()}
    assert deployed["echo-local"] == deployed["echo-k8s"] == "tests.unit.flows.echo_stage.echo_flow"
    text = tmp_path / "prefect.yaml"
    text.write_text((ROOT / "prefect.yaml").read_text())
    registry.write_prefect_yaml(text)
    rewritten = _deployed(yaml.safe_load(text.read_text()))
    assert ("echo-local", "tests.unit.flows.echo_stage.echo_flow", "hindsight-local") in rewritten
    assert registry.stage("echo").load_spec().name == "echo"


def test_the_pipeline_runs_only_the_enabled_stages_in_order(tmp_path):
    cfg = PipelineConfig.model_validate({"name": "t", "run_dir": str(tmp_path), "reward_model": {"enabled": False}})
    assert [s.name for s in registry.pipeline_stages(cfg)] == ["sft", "rl"]
