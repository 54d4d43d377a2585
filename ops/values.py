"""Value classes that cost next to nothing to define: the run path's records.

`@dataclass` compiles each class's `__init__`, `__repr__` and `__eq__` (and a frozen class's
`__setattr__`, `__delattr__` and `__hash__`) from generated source when the class is defined:
1.3 to 5.6 M instructions a class, ~44 M for the twenty that `manage.py run_job` imports, on
every fire (bench/RESULTS.md, P9). A `Value` subclass is read the same way (annotated fields in
order, defaults from the class body, `field(default_factory=...)`) and behaves the same way
(keyword or positional construction, field-wise equality, the same repr; `frozen=True`:
assignment refused with FrozenInstanceError, hashable), with shared methods instead of
generated ones. Type checkers read it as a dataclass (PEP 681).
"""

import inspect
from collections.abc import Callable
from dataclasses import FrozenInstanceError
from typing import Any, ClassVar, TypeVar, dataclass_transform

V = TypeVar("V", bound="Value")


class _Factory:
    __slots__ = ("make",)

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make


def field(*, default_factory: Callable[[], Any]) -> Any:
    """A field whose default is made anew for each instance (a list, a set)."""
    return _Factory(default_factory)


def _refuse_set(self: object, name: str, value: object) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _refuse_delete(self: object, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r}")


def _hash(self: "Value") -> int:
    return hash(self._values())


@dataclass_transform(field_specifiers=(field,))
class Value:
    """Fields: the annotations of the class body (but ClassVar's), in order. `class X(Value,
    frozen=True)` for an immutable, hashable one (as `@dataclass(frozen=True)`); else
    unhashable, as `@dataclass`."""

    _fields: ClassVar[tuple[str, ...]] = ()
    _defaults: ClassVar[dict[str, Any]] = {}

    def __init_subclass__(cls, *, frozen: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = [
            name
            for name, kind in inspect.get_annotations(cls).items()
            if kind is not ClassVar
            and getattr(kind, "__origin__", None) is not ClassVar
            and not (isinstance(kind, str) and kind.startswith(("ClassVar", "typing.ClassVar")))
        ]
        defaults = dict(cls._defaults)
        for name in own:
            if name in cls.__dict__:
                default = cls.__dict__[name]
                if isinstance(default, list | dict | set):  # as @dataclass: one shared by all
                    raise ValueError(f"mutable default for field {name}: use default_factory")
                defaults[name] = default
                if isinstance(default, _Factory):
                    delattr(cls, name)  # as @dataclass: no class attribute for a factory
        # A field given again in a subclass keeps its place (as @dataclass).
        fields = cls._fields + tuple(name for name in own if name not in cls._fields)
        if "__hash__" in cls.__dict__ and cls.__dict__["__hash__"] is not None:
            frozen_hash = cls.__dict__["__hash__"]  # the class's own, as @dataclass keeps it
        else:
            frozen_hash = _hash
        seen_default = False
        for name in fields:  # as @dataclass: no required field after one with a default
            if name in defaults:
                seen_default = True
            elif seen_default:
                raise TypeError(f"non-default argument {name!r} follows default argument")
        cls._fields = fields
        cls._defaults = defaults
        if frozen:
            cls.__setattr__ = _refuse_set  # type: ignore[method-assign]
            cls.__delattr__ = _refuse_delete  # type: ignore[method-assign]
            cls.__hash__ = frozen_hash  # type: ignore[method-assign]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        fields, kind = self._fields, type(self).__qualname__
        if len(args) > len(fields):
            raise TypeError(f"{kind}() takes {len(fields)} arguments, {len(args)} given")
        given = dict(zip(fields, args, strict=False))
        for name, value in kwargs.items():
            if name not in fields:
                raise TypeError(f"{kind}() got an unexpected keyword argument {name!r}")
            if name in given:
                raise TypeError(f"{kind}() got multiple values for argument {name!r}")
            given[name] = value
        state, defaults = self.__dict__, self._defaults
        for name in fields:  # written in the fields' order, as @dataclass's __init__ does
            if name in given:
                state[name] = given[name]
            elif name in defaults:
                default = defaults[name]
                state[name] = default.make() if isinstance(default, _Factory) else default
            else:
                raise TypeError(f"{kind}() missing required argument: {name!r}")

    def _values(self) -> tuple[Any, ...]:
        return tuple([getattr(self, name) for name in self._fields])

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Value)
        return self._values() == other._values()

    __hash__ = None  # type: ignore[assignment]  # as @dataclass with eq and not frozen

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__qualname__}({shown})"

    def as_dict(self) -> dict[str, Any]:
        """The fields and their values (shallow: dataclasses.asdict would copy them too)."""
        return {name: getattr(self, name) for name in self._fields}


def replace(value: V, **changes: Any) -> V:
    """A copy of `value` with `changes` (as dataclasses.replace)."""
    return type(value)(**{**value.as_dict(), **changes})
