"""Reading YAML files for configs: `--set` overrides, and validation errors that name the
file, line and field (pydantic's location mapped back onto the YAML text). The loader is
PyYAML's safe one, stricter: a key given twice is an error (not the last one silently winning),
and so is a document that expands more aliases than a config ever needs (a "billion laughs")."""
from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from hindsight.config.legacy import as_written, current_path
from hindsight.errors import ConfigError


MAX_ALIASES = 100  # a hand-written config reuses a block a few times; an alias bomb, millions


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and alias bombs, naming the line."""

    def __init__(self, stream):
        super().__init__(stream)
        self.aliases = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                mark = self.peek_event().start_mark
                raise yaml.constructor.ConstructorError(
                    None, None, f"more than {MAX_ALIASES} aliases (*name): refused, as an alias bomb would be", mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is given twice",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def load_yaml(text: str):
    return yaml.load(text, Loader=_StrictLoader)


def apply_override(raw: dict, assignment: str) -> None:
    """`a.b=c` sets raw['a']['b'] = yaml(c), creating intermediate tables."""
    key, sep, value = assignment.partition("=")
    if not sep or not key:
        raise ConfigError(f"--set {assignment!r}: expected KEY.PATH=VALUE")
    node = raw
    parts = current_path(key).split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {assignment!r}: {part} is not a table")
    try:
        node[parts[-1]] = yaml.safe_load(value)
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {assignment!r}: malformed YAML value ({getattr(exc, 'problem', None) or exc}); "
                          f"quote a string that holds YAML syntax") from None


def read_yaml_mapping(path: str | Path, overrides: list[str] | tuple[str, ...] = (), what: str = "config"):
    """(the mapping with `--set` overrides applied, the file's text); bad YAML names the file and line."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: {what} file not found")
    if not path.is_file():
        raise ConfigError(f"{path}: {what} path is a directory, not a YAML file")
    data = path.read_bytes()
    if b"\x00" in data:
        raise ConfigError(f"{path}: {what} file is binary, not YAML text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: {what} file is not valid UTF-8 (byte {data[exc.start]:#04x})") from None
    try:
        raw = load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"{where}: malformed YAML ({getattr(exc, 'problem', exc)})") from None
    if raw is None:  # an empty file ran the whole demo into the user's folder: say so instead
        raise ConfigError(f"{path}: {what} file is empty (start from configs/demo.yaml, or name at least "
                          f"`name:` and the stages' settings)")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(raw).__name__}")
    for assignment in overrides:
        apply_override(raw, assignment)
    return raw, text


def describe_errors(exc: ValidationError, path: Path, text: str) -> str:
    lines = []
    for err in exc.errors():
        loc = as_written(err["loc"], lambda path: _key_line(text, path, exact=True) is not None)
        field = ".".join(str(p) for p in loc)
        line = _key_line(text, loc)
        where = f"{path}:{line}" if line else str(path)
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        lines.append(f"{where}: {field or '(top level)'}: {msg}")
    return "\n".join(lines)


def _key_line(text: str, loc: tuple, exact: bool = False) -> int | None:
    """Line of the deepest YAML key on `loc` that exists in the file (None if none); `exact`: of
    the key `loc` itself, None when the file does not hold it."""
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    line = None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = [(k, v) for k, v in node.value if k.value == str(part)]
            if not match:
                break
            line, node = match[0][0].start_mark.line + 1, match[0][1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    else:
        return line
    return None if exact else line
