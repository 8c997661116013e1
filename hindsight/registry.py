"""One idiom for every registry of variants (losses, algorithms, rollout engines, learner
strategies, tool-call parsers, alert rules): an entry is registered by decorating it, looked up by
name (a miss names the registered ones), and listed for the config's choices.

A class registers under its `name` (`@LOSSES.register`); a function under a name given
(`@PARSERS.named("hermes")`). Built-in entries that would import heavy modules (torch) are named
with the module that registers them (`built_in`): `names()` and `check()` know them without an
import, and the first `lookup()` imports the module.
"""
from __future__ import annotations

import importlib
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Registry(dict, Generic[T]):
    """name -> entry. `kind` is what an error calls an entry ("policy loss", "algorithm");
    `validate(entry)` may refuse one at registration (raise)."""

    def __init__(self, kind: str, built_in: dict[str, str] | None = None,
                 validate: Callable[[T], None] | None = None):
        super().__init__()
        self.kind, self.built_in, self.validate = kind, dict(built_in or {}), validate

    def register(self, cls: T) -> T:
        """Decorator: `@REGISTRY.register` on a class with a `name`."""
        return self.named(cls.name)(cls)

    def named(self, name: str) -> Callable[[T], T]:
        """Decorator: `@REGISTRY.named("hermes")` on a function (or any entry without a `name`)."""
        def add(entry: T) -> T:
            if name in self and self[name] is not entry:
                raise ValueError(f"{self.kind} {name!r} is registered twice ({_label(self[name])}, {_label(entry)})")
            if self.validate is not None:
                self.validate(entry)
            self[name] = entry
            return entry
        return add

    def names(self) -> list[str]:
        return sorted(set(self) | set(self.built_in))

    def check(self, name: str) -> str:
        """`name` if an entry has it (registered or built in), else one ValueError naming those
        that exist; imports nothing."""
        if name not in self and name not in self.built_in:
            raise ValueError(f"unknown {self.kind} {name!r}; registered: {', '.join(self.names())}")
        return name

    def lookup(self, name: str) -> T:
        self.check(name)
        if name not in self:
            importlib.import_module(self.built_in[name])
        return self[name]

    def remove(self, name: str) -> None:
        """Take an entry out (a test's own, after the test)."""
        self.pop(name, None)


def _label(entry) -> str:
    return getattr(entry, "__name__", repr(entry))
