import shutil
import subprocess

import pytest

from hindsight.data.rows import dvc_dir_md5, load_rows, pinned_md5, read_jsonl

from hindsight.data.demo import build_demo_data, forgot_carry
from hindsight.errors import DataError


def test_malformed_jsonl_names_file_and_line(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"prompt": "a"}\n\n{"prompt": "b",}\n')
    with pytest.raises(DataError, match=r"d.jsonl:3: malformed JSON"):
        read_jsonl(p)


def test_missing_column_names_line(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"prompt": "a", "answer": "1"}\n{"prompt": "b"}\n')
    with pytest.raises(DataError, match=r"d.jsonl:2: missing required column\(s\) \['answer'\]"):
        read_jsonl(p, required=("prompt", "answer"))


def test_non_object_line(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('[1, 2]\n')
    with pytest.raises(DataError, match=r"d.jsonl:1: expected a JSON object"):
        read_jsonl(p)


def test_empty_and_missing_files(tmp_path):
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(DataError, match="dataset is empty"):
        read_jsonl(tmp_path / "e.jsonl")
    with pytest.raises(DataError, match="data file not found"):
        read_jsonl(tmp_path / "missing.jsonl")


def test_parquet_and_column_renames(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"question": "q1", "answer": "1"}]), tmp_path / "d.parquet")
    rows = load_rows(str(tmp_path / "d.parquet"), required=("prompt",), columns={"question": "prompt"})
    assert rows == [{"prompt": "q1", "answer": "1"}]
    with pytest.raises(DataError, match="row 0: missing required column"):
        load_rows(str(tmp_path / "d.parquet"), required=("prompt",))


def test_demo_data_is_deterministic_and_has_the_designed_mistake(tmp_path):
    a = build_demo_data(tmp_path / "a")
    build_demo_data(tmp_path / "b")
    assert dvc_dir_md5(tmp_path / "a") == dvc_dir_md5(tmp_path / "b")
    sft = read_jsonl(a["sft.jsonl"])
    carry = [r for r in sft if int(r["prompt"].split()[6]) >= 10]
    wrong = [r for r in carry if r["completion"] != str(sum(int(w) for w in r["prompt"].split() if w.isdigit()))]
    assert 0.5 < len(wrong) / len(carry) < 0.7  # most carry demonstrations drop the ten
    assert forgot_carry(40, 13) == 43
    pair = lambda r: (r["prompt"].split()[2], r["prompt"].split()[6])  # noqa: E731
    evals = {pair(r) for r in read_jsonl(a["eval.jsonl"])}
    assert evals and not evals & {pair(r) for r in sft}  # held-out sums are never demonstrated


@pytest.mark.integration  # runs git and the dvc CLI
def test_dvc_dir_md5_matches_dvc_itself(tmp_path):
    if shutil.which("dvc") is None:
        pytest.fail("dvc is a dependency and must be installed")
    build_demo_data(tmp_path / "data")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["dvc", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["dvc", "add", "-q", "data"], cwd=tmp_path, check=True)
    assert dvc_dir_md5(tmp_path / "data") == pinned_md5(tmp_path / "data.dvc")


def test_repo_data_dvc_pin_matches_the_builder(tmp_path):
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    build_demo_data(tmp_path / "data")
    assert dvc_dir_md5(tmp_path / "data") == pinned_md5(root / "data.dvc")


def test_repo_data_tools_dvc_pin_matches_the_builder(tmp_path):
    """data-tools.dvc pins what `hindsight data build --demo tool_sums` writes for the multi-turn demos."""
    from pathlib import Path

    from hindsight.data.toolsums import build_tool_data

    root = Path(__file__).resolve().parents[3]
    build_tool_data(tmp_path / "data-tools")
    assert dvc_dir_md5(tmp_path / "data-tools") == pinned_md5(root / "data-tools.dvc")
