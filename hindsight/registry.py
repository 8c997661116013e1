"""One idiom for every registry of variants: a class with a `name` is registered by decorating
it, looked up by name (a miss names the registered ones), and listed for the config's choices."""
from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(dict, Generic[T]):
    """name -> class. `kind` is what an error calls an entry ("policy loss", "algorithm")."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def register(self, cls: T) -> T:
        """Decorator: `@LOSSES.register` on a class with a `name`."""
        if cls.name in self and self[cls.name] is not cls:
            raise ValueError(f"{self.kind} {cls.name!r} is registered twice ({self[cls.name].__name__}, {cls.__name__})")
        self[cls.name] = cls
        return cls

    def lookup(self, name: str) -> T:
        try:
            return self[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; registered: {', '.join(sorted(self))}") from None
