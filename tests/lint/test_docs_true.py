"""The docs say what main does: every config block in README.md and docs/ validates against the
config schema without a deprecation line, every `python bench/NAME.py` they tell a reader to run
exists, and every repository path they name in backticks exists."""
import logging
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# folders a backticked path may start with: a path under one of them names a file of this repository
TRACKED = ("hindsight/", "flows/", "tasks/", "tracking/", "rewards/", "cli/", "bench/", "configs/", "tests/",
           "deploy/", "docs/", ".ci/")


def _blocks(lang: str) -> list[tuple[str, str]]:
    """(`file:line`, body) of each fenced block of `lang` in the docs."""
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for m in re.finditer(rf"```{lang}\n(.*?)```", text, re.S):
            out.append((f"{doc.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 2}", m.group(1)))
    return out


CONFIG_BLOCKS = [(where, body) for where, body in _blocks("ya?ml") if "apiVersion:" not in body]  # not k8s manifests


@pytest.mark.parametrize("where,body", CONFIG_BLOCKS, ids=[w for w, _ in CONFIG_BLOCKS])
def test_every_config_block_in_the_docs_validates_with_todays_keys(where, body, caplog):
    from hindsight.config import PipelineConfig

    raw = yaml.safe_load(body)
    with caplog.at_level(logging.WARNING):
        PipelineConfig.model_validate({"name": "doc", **raw})
    deprecated = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert not deprecated, f"{where}: {deprecated}"


def test_there_are_config_blocks_to_check():
    assert len(CONFIG_BLOCKS) >= 6  # a regex that stopped matching would make the test above vacuous


def test_every_bench_script_the_docs_name_exists():
    named = {m for doc in DOCS for m in re.findall(r"python (bench/[\w/]+\.py)", doc.read_text())}
    assert len(named) >= 10
    assert sorted(n for n in named if not (ROOT / n).exists()) == []


def _names_something_real(path: str) -> bool:
    """A file or folder of the repository, or `module.attribute` (tracking/store.require_reachable)
    whose module file defines that attribute."""
    if (ROOT / path).exists():
        return True
    module, _, attr = path.rpartition(".")
    file = ROOT / f"{module}.py"
    return bool(module) and file.is_file() and re.search(rf"^\s*(def|class) {attr}\b|^{attr}\s*=", file.read_text(),
                                                        re.M) is not None


def test_every_repository_path_in_backticks_exists():
    missing, checked = [], 0
    for doc in DOCS:
        for span in re.findall(r"`([^`\s]+)`", doc.read_text()):
            path = span.split(":")[0].rstrip(".,)")  # `hindsight/lookback/metrics.py: recorded_name`
            if not path.startswith(TRACKED) or any(c in path for c in "*{}<>$") or "NAME" in path:
                continue
            if Path(path).name.startswith("my_") or "beside the config" in doc.read_text().split(span)[1][:40]:
                continue  # a file the reader writes (`flows/my_stage.py`, a reward folder beside their config)
            checked += 1
            if not _names_something_real(path):
                missing.append(f"{doc.relative_to(ROOT)}: {span}")
    assert missing == [] and checked >= 100, (missing, checked)
