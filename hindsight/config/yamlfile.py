"""Reading YAML files for configs: `--set` overrides, and validation errors that name the
file, line and field (pydantic's location mapped back onto the YAML text). The loader is
PyYAML's safe one, stricter, for files and `--set` values alike: a key given twice is an error
(not the last one silently winning), and every size is bounded before anything is built from
it: the file, each scalar, the nesting depth, the aliases, and the nodes the aliases expand to
(a "billion laughs" nests a few aliases many levels deep: few aliases, billions of nodes)."""
from __future__ import annotations

import json
from pathlib import Path

import yaml
from pydantic import ValidationError

from hindsight.config.legacy import as_written, current_path
from hindsight.errors import ConfigError


MAX_ALIASES = 100           # a hand-written config reuses a block a few times; an alias bomb, millions
MAX_NODES = 100_000         # nodes of the document with every alias expanded (a config has hundreds)
MAX_DEPTH = 64              # nesting of mappings and sequences
MAX_SCALAR = 64 << 10       # characters of one value
MAX_FILE_BYTES = 1 << 20    # a config file


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys, alias bombs, deep nesting and huge scalars, naming the line."""

    def __init__(self, stream):
        super().__init__(stream)
        self.aliases, self.depth = 0, 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                self._refuse(f"more than {MAX_ALIASES} aliases (*name): refused, as an alias bomb would be")
        elif self.check_event(yaml.ScalarEvent) and len(self.peek_event().value) > MAX_SCALAR:
            self._refuse(f"a value longer than {MAX_SCALAR >> 10} KiB characters: refused")
        self.depth += 1
        if self.depth > MAX_DEPTH:
            self._refuse(f"nested deeper than {MAX_DEPTH} levels: refused")
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def _refuse(self, why: str):
        raise yaml.constructor.ConstructorError(None, None, why, self.peek_event().start_mark)

    def construct_document(self, node):
        _expanded_size(node)  # before anything is built from it
        return super().construct_document(node)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is given twice",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def _expanded_size(root) -> int:
    """How many nodes the document has with every alias expanded, counted without expanding:
    an alias is the same node object, so its size is computed once and counted each time it is used."""
    sizes: dict[int, int] = {}
    order, todo = [], [root]
    while todo:  # children before parents, each node once
        node = todo.pop()
        if id(node) in sizes:
            continue
        sizes[id(node)] = 0
        order.append(node)
        todo += _children(node)
    for node in reversed(order):
        size = 1 + sum(sizes[id(c)] for c in _children(node))
        if size > MAX_NODES:
            raise yaml.constructor.ConstructorError(
                None, None, f"more than {MAX_NODES} nodes once its aliases are expanded: refused, as an alias bomb "
                            f"would be", node.start_mark)
        sizes[id(node)] = size
    return sizes[id(root)]


def _children(node) -> list:
    if isinstance(node, yaml.MappingNode):
        return [x for pair in node.value for x in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


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
        node[parts[-1]] = load_yaml(value)  # the same bounds as a file
    except RecursionError:
        raise ConfigError(f"--set {assignment!r}: nested deeper than {MAX_DEPTH} levels") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {assignment!r}: malformed YAML value ({getattr(exc, 'problem', None) or exc}); "
                          f"quote a string that holds YAML syntax") from None


def read_yaml_mapping(path: str | Path, overrides: list[str] | tuple[str, ...] = (), what: str = "config",
                      smoke: bool = False):
    """(the mapping with `--set` overrides applied, the file's text); bad YAML names the file and line.
    A top-level `smoke:` block (dotted keys and values) is the file's smoke-size preset: applied
    with `smoke`, before the overrides, and never part of the config itself."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: {what} file not found")
    if not path.is_file():
        raise ConfigError(f"{path}: {what} path is a directory, not a YAML file")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise ConfigError(f"{path}: {what} file is larger than {MAX_FILE_BYTES >> 20} MiB; a config is a few KB")
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
    except RecursionError:  # the parser itself, before the composer's depth check
        raise ConfigError(f"{path}: nested deeper than {MAX_DEPTH} levels") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"{where}: malformed YAML ({getattr(exc, 'problem', exc)})") from None
    if raw is None:  # an empty file ran the whole demo into the user's folder: say so instead
        raise ConfigError(f"{path}: {what} file is empty (start from configs/demo.yaml, or name at least "
                          f"`name:` and the stages' settings)")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(raw).__name__}")
    preset = raw.pop("smoke", None)
    if preset is not None and not isinstance(preset, dict):
        raise ConfigError(f"{path}:{_key_line(text, ('smoke',)) or 1}: smoke: a mapping of KEY.PATH: value, "
                          f"the overrides --smoke applies")
    if smoke and not preset:
        raise ConfigError(f"{path}: no `smoke:` preset to apply (--smoke); add one, e.g. smoke: {{rl.steps: 2}}")
    for assignment in [f"{k}={json.dumps(v)}" for k, v in (preset or {}).items() if smoke] + list(overrides):
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
