"""One name -> object registry for everything a config picks by name (RL algorithms and their
parts, task families), at the bottom of the layers so every layer can keep one.

    FAMILIES = Registry("task family")
    FAMILIES.add("toy", ToyFamily())          # or @REG.register("x") on a function
    FAMILIES.get("toy"); FAMILIES.names(); "toy" in FAMILIES
"""

from __future__ import annotations

from typing import Any, Callable


class UnknownNameError(KeyError, ValueError):
    """An unknown registry name. Both a KeyError (it is a lookup) and a ValueError (it is a bad
    config value), so callers may catch either."""

    def __str__(self) -> str:  # KeyError.__str__ would repr() the message into quotes
        return str(self.args[0])


class Registry:
    """name -> object. `@reg.register("x")` or `reg.add("x", obj)` adds, `reg.get("x")` looks up,
    `reg.names()` lists."""

    def __init__(self, kind: str) -> None:
        self.kind = kind  # used in error messages: "unknown policy loss 'x'"
        self._items: dict[str, Any] = {}

    def add(self, name: str, item: Any) -> Any:
        if name in self._items:  # silent overwrite would swap an algorithm behind the config's back
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._items[name] = item
        return item

    def register(self, name: str) -> Callable[[Any], Any]:
        return lambda item: self.add(name, item)

    def get(self, name: str) -> Any:
        try:
            return self._items[name]
        except KeyError:
            raise UnknownNameError(f"unknown {self.kind} {name!r}; available: {', '.join(self.names())}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items
