"""ops.values: the run path's value classes behave as the @dataclass classes they replaced."""

import dataclasses

import pytest

from ops.values import Value, field, replace


class Point(Value):
    x: int
    y: int = 0
    tags: list[str] = field(default_factory=list)

    @property
    def norm(self) -> int:
        return abs(self.x) + abs(self.y)


class Key(Value, frozen=True):
    name: str
    version: int = 1


@dataclasses.dataclass
class PointDC:
    x: int
    y: int = 0
    tags: list[str] = dataclasses.field(default_factory=list)


def test_a_value_is_built_compared_and_shown_as_a_dataclass_is():
    assert Point(1) == Point(x=1, y=0, tags=[])
    assert Point(1, 2) != Point(1, 3)
    assert Point(1) != PointDC(1)  # another class: never equal, as between two dataclasses
    assert repr(Point(1, 2, ["a"])) == repr(PointDC(1, 2, ["a"])).replace("PointDC", "Point")
    assert vars(Point(1, 2)) == vars(PointDC(1, 2))  # the same attributes, in the same order
    assert Point(3, -4).norm == 7
    assert Point(1).tags is not Point(1).tags  # a factory's default is made for each instance
    assert "tags" not in Point.__dict__ and Point.y == 0  # as @dataclass leaves them
    point = Point(1)
    point.y = 5
    assert point == Point(1, 5)
    with pytest.raises(TypeError):
        hash(point)  # mutable: unhashable, as a dataclass with eq


def test_a_value_refuses_what_a_dataclass_refuses():
    with pytest.raises(TypeError, match="missing required argument: 'x'"):
        Point()
    with pytest.raises(TypeError, match="unexpected keyword argument 'z'"):
        Point(1, z=2)
    with pytest.raises(TypeError, match="multiple values for argument 'x'"):
        Point(1, x=2)
    with pytest.raises(TypeError, match="takes 3 arguments, 4 given"):
        Point(1, 2, [], 4)


def test_a_frozen_value_is_immutable_and_hashable():
    key = Key("nightly")
    with pytest.raises(dataclasses.FrozenInstanceError):
        key.version = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del key.name  # type: ignore[misc]
    assert {Key("nightly"), Key("nightly", 1), Key("nightly", 2)} == {key, Key("nightly", 2)}
    assert replace(key, version=3) == Key("nightly", 3) and key.version == 1
    assert key.as_dict() == {"name": "nightly", "version": 1}


def test_a_value_refuses_the_class_bodies_a_dataclass_refuses():
    with pytest.raises(ValueError, match="mutable default for field tags"):

        class Shared(Value):
            tags: list = []

    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):

        class Order(Value):
            a: int = 1
            b: int


def test_a_subclass_field_given_again_keeps_its_place_and_a_string_classvar_is_no_field():
    class Base(Value):
        x: int
        y: int = 2

    class Again(Base):
        x: int = 5
        kind: "ClassVar[str]" = "again"  # noqa: F821  (as under future annotations)

    assert repr(Again()).endswith(".Again(x=5, y=2)")
    assert Again(7).x == 7


def test_a_frozen_value_keeps_its_own_hash():
    class Keyed(Value, frozen=True):
        key: str
        note: str = ""

        def __hash__(self) -> int:
            return hash(self.key)

    assert hash(Keyed("a", "x")) == hash("a")
