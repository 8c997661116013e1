"""Datasets: line-numbered JSONL/parquet/hub loading, JSONL writing, and the DVC md5 of a data folder."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from hindsight.data.chat import as_chat, format_of, normalise_row
from hindsight.data.procedural import is_procedural, load_procedural
from hindsight.errors import DataError


MAX_LINE_BYTES = 16 << 20  # one JSONL row; a longer line is refused before it is read whole
MAX_DEPTH = 64             # nesting of one row (a chat message is 3 levels deep)
MAX_FILE_BYTES = 4 << 30   # one data file, and what a parquet file unpacks to


def nesting_depth(value, stop: int = MAX_DEPTH) -> int:
    """How deeply lists and objects nest in `value`, without recursion (counting stops past `stop`)."""
    depth, todo = 0, [(value, 1)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, (list, dict)):
            depth = max(depth, level)
            if depth > stop:
                return depth
            todo.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return depth


def read_jsonl(path: str | Path, required: tuple[str, ...] = ()) -> list[dict]:
    """Read a JSONL file; every error names the file and the 1-based line."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: data file not found")
    if not path.is_file():
        raise DataError(f"{path}: data path is a directory, not a JSONL file")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise DataError(f"{path}: larger than {MAX_FILE_BYTES >> 30} GiB")
    rows = []
    with path.open("rb") as fh:
        for lineno, raw in enumerate(iter(lambda: fh.readline(MAX_LINE_BYTES + 1), b""), start=1):
            if len(raw) > MAX_LINE_BYTES:  # read no further: a 50 MB prompt line used to take 8.6 GB
                raise DataError(f"{path}:{lineno}: line longer than {MAX_LINE_BYTES >> 20} MiB; split the row, "
                                f"or shorten its text")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"{path}:{lineno}: not valid UTF-8 (byte {raw[exc.start]:#04x} at column "
                                f"{exc.start + 1})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno}: malformed JSON ({exc.msg} at column {exc.colno})") from None
            except RecursionError:
                row = None
            if row is None or nesting_depth(row) > MAX_DEPTH:
                raise DataError(f"{path}:{lineno}: JSON nested deeper than {MAX_DEPTH} levels")
            if not isinstance(row, dict):
                raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            missing = [c for c in required if c not in row]
            if missing:
                raise DataError(f"{path}:{lineno}: missing required column(s) {missing}")
            rows.append(row)
    if not rows:
        raise DataError(f"{path}: dataset is empty")
    return rows


def load_rows(source: str, required: tuple[str, ...] = (), split: str = "train",
              columns: dict[str, str] | None = None, limit: int | None = None, chat: dict | None = None,
              key: str | None = None) -> list[dict]:
    """Load a local .jsonl/.parquet file, a hub dataset (`hf://name[:config]`) or procedural
    tasks (`rg://task?size=N&seed=S`, `data.procedural`).

    `columns` renames source columns to the names the stage expects, so GSM8K's
    `question`/`answer` can feed `prompt`/`answer` without a conversion step. `chat`
    ({"system": text or None}) turns plain-text columns into chat turns (`data.prompt_format`).
    `DataConfig.reading(name)` gives all of these for one of the config's files, and `key`, the
    setting that named the file (`data.prompts`), which a missing file's error names.
    """
    local = not (is_procedural(source) or source.startswith("hf://"))
    if local and not Path(source).exists():
        where = "" if Path(source).is_absolute() else f", relative to the working directory {Path.cwd()}"
        raise DataError(f"{source}: data file not found ({key or 'the data path'}{where})")
    if is_procedural(source):
        rows = load_procedural(source)
    elif source.startswith("hf://"):
        rows = _load_hub_rows(source.removeprefix("hf://"), split)
    elif source.endswith(".parquet"):
        rows = _load_parquet_rows(source)
    else:
        rows = read_jsonl(source)
    if columns:
        rows = [{columns.get(k, k): v for k, v in r.items()} for r in rows]
    rows = [normalise_row(r, required) for r in rows]  # conversational columns -> the ones asked for
    if chat is not None:
        rows = [as_chat(r, required, chat.get("system")) for r in rows]
    for i, row in enumerate(rows):
        where = f"{source}:{i + 1}" if source.endswith(".jsonl") else f"{source} row {i}"
        missing = [c for c in required if c not in row]
        if missing:
            raise DataError(f"{where}: missing required column(s) {missing}")
        for column in required:
            _check_text(row[column], f"{where}: column {column!r}")
    return rows[:limit] if limit else rows


def format_mismatch(cfg) -> str | None:
    """When RL starts from the SFT stage's model, SFT's prompts and the RL and eval prompts
    must be in one format: a policy trained on chat turns and prompted with plain text (or the
    reverse) answers garbage. Returns the warning that names both, or None."""
    if not cfg.sft.enabled or cfg.rl.init is not None:
        return None
    d = cfg.data
    try:
        trained = format_of(load_rows(**d.reading("sft", limit=1)))
    except DataError:  # not this stage's file: its own stage reports it
        return None
    formats = {name: format_of(load_rows(**d.reading(name, limit=1))) for name in ("prompts", "eval")}
    off = [f"data.{name} ({getattr(d, name)}) {fmt}" for name, fmt in formats.items() if fmt != trained]
    if not off:
        return None
    return (f"SFT trained on {trained} prompts (data.sft: {d.sft}) but {' and '.join(off)}: the policy is prompted in "
            f"a format it was not trained on; set data.prompt_format: chat to make plain-text prompts user turns, or "
            f"give every file the same format")


def _check_text(value, where: str) -> None:
    """A text column holds a string, or chat messages ({role, content} with string content), of
    valid Unicode: checked here so a bad row fails in preflight, not after the model has loaded."""
    if isinstance(value, list) and value and all(isinstance(m, dict) for m in value):
        for j, message in enumerate(value):
            if not isinstance(message.get("role"), str) or "content" not in message:
                raise DataError(f"{where}: message {j} needs a string 'role' and a 'content'")
            _check_text(message["content"], f"{where}: message {j} content")
        return
    if not isinstance(value, str):
        raise DataError(f"{where} must be text (or a list of chat messages), got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise DataError(f"{where} holds a lone surrogate ({value[exc.start]!a} at character {exc.start}), "
                        f"which is not valid Unicode text") from None


def _load_parquet_rows(path: str) -> list[dict]:
    import pyarrow.parquet as pq

    if not Path(path).exists():
        raise DataError(f"{path}: data file not found")
    try:
        meta = pq.ParquetFile(path).metadata
    except Exception as exc:  # not parquet, or a footer pyarrow cannot read
        raise DataError(f"{path}: not a readable parquet file ({type(exc).__name__}: {str(exc)[:200]})") from None
    check_parquet(path, meta)
    rows = pq.read_table(path).to_pylist()
    if not rows:
        raise DataError(f"{path}: dataset is empty")
    return rows


def check_parquet(path: str, meta) -> None:
    """A parquet file's sizes, read from its metadata before any value is: the file, what it
    unpacks to, each column of each row group against the row cap JSONL has (MAX_LINE_BYTES a
    row), and how deeply its columns nest."""
    if Path(path).stat().st_size > MAX_FILE_BYTES:
        raise DataError(f"{path}: larger than {MAX_FILE_BYTES >> 30} GiB")
    total = 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            col = group.column(c)
            size = col.total_uncompressed_size
            total += size
            if size > MAX_LINE_BYTES * max(group.num_rows, 1):
                raise DataError(f"{path}: row group {g}, column {col.path_in_schema!r} holds {size >> 20} MiB for "
                                f"{group.num_rows} row(s), more than {MAX_LINE_BYTES >> 20} MiB a row; split the "
                                f"rows, or shorten their text")
    if total > MAX_FILE_BYTES:
        raise DataError(f"{path}: unpacks to {total >> 30} GiB, more than {MAX_FILE_BYTES >> 30} GiB")
    depth = max((_type_depth(field.type) for field in meta.schema.to_arrow_schema()), default=0)
    if depth > MAX_DEPTH:
        raise DataError(f"{path}: a column nested deeper than {MAX_DEPTH} levels")


def _type_depth(t) -> int:
    """How deeply an arrow type nests lists and structs, without recursion."""
    import pyarrow as pa

    depth, todo = 0, [(t, 1)]
    while todo:
        item, level = todo.pop()
        depth = max(depth, level)
        if depth > MAX_DEPTH:
            return depth
        if pa.types.is_list(item) or pa.types.is_large_list(item) or pa.types.is_fixed_size_list(item):
            todo.append((item.value_type, level + 1))
        elif pa.types.is_struct(item):
            todo.extend((item.field(i).type, level + 1) for i in range(item.num_fields))
        elif pa.types.is_map(item):
            todo.extend(((item.key_type, level + 1), (item.item_type, level + 1)))
    return depth


def _load_hub_rows(spec: str, split: str) -> list[dict]:
    from datasets import load_dataset

    name, _, config = spec.partition(":")
    return list(load_dataset(name, config or None, split=split))


def write_jsonl(path: Path, rows: list[dict]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, sort_keys=True) + "\n")
    tmp.replace(path)


# --- DVC-compatible hashing ----------------------------------------------------------

def file_md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def dvc_dir_md5(directory: str | Path) -> str:
    """The md5 DVC 3 pins for a tracked directory: md5 of its sorted JSON listing + '.dir'.

    Computed here so the pipeline can check data against `data.dvc` without importing dvc;
    a test checks it against `dvc add` itself.
    """
    directory = Path(directory)
    entries = [
        {"md5": file_md5(p), "relpath": p.relative_to(directory).as_posix()}
        for p in sorted(directory.rglob("*"), key=lambda p: p.relative_to(directory).as_posix())
        if p.is_file()
    ]
    blob = json.dumps(entries, sort_keys=True).encode("utf-8")
    return hashlib.md5(blob).hexdigest() + ".dir"


def pinned_md5(dvc_file: str | Path) -> str:
    """Read the md5 pinned in a `.dvc` file (a tiny YAML we parse without a YAML dependency)."""
    for line in Path(dvc_file).read_text().splitlines():
        line = line.strip().lstrip("- ").strip()
        if line.startswith("md5:"):
            return line.split(":", 1)[1].strip()
    raise DataError(f"{dvc_file}: no md5 found")
