"""Messages and tables pickle as their class and field values, and come back equal."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from app_toolkit import deployment_id
from app_toolkit._runtime import messages, tables
from app_toolkit._runtime.compact import compact
from app_toolkit._runtime.messages import DeploymentID, ReplicaInfo
from app_toolkit._runtime.tables import ReplicaTable, ShadowTarget, Update


@compact
@dataclasses.dataclass(frozen=True, slots=True)
class Empty:
    pass


@compact
@dataclasses.dataclass(frozen=True, slots=True)
class One:
    value: int = 3


def test_a_table_of_replicas_comes_back_equal() -> None:
    deployment = DeploymentID("chat", "Ingress")
    infos = tuple(
        ReplicaInfo(f"chat.Ingress.{n}", deployment, "10.0.0.1", 9000 + n, b"t", 5, f"node-{n}", rank=n)
        for n in range(3)
    )
    table = ReplicaTable(infos, 100, "prefer", ((deployment, 1.0),), ShadowTarget(deployment, 0.5))
    update = {"replicas:chat/Ingress": Update(7, table)}
    assert pickle.loads(pickle.dumps(update, protocol=pickle.HIGHEST_PROTOCOL)) == update


def test_every_message_and_table_class_is_compact() -> None:
    checked = 0
    for module in (messages, tables, deployment_id):  # deployment_id: below the runtime, by hand
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and dataclasses.is_dataclass(value)
                and value.__module__ == module.__name__
            ):
                assert "__reduce__" in vars(value), f"{value.__name__} is not @compact"
                checked += 1
    assert checked >= 10, f"only {checked} message classes found: has the vocabulary moved?"


def test_classes_of_one_or_no_field_and_defaults_round_trip() -> None:
    for obj in (Empty(), One(), One(5)):
        assert pickle.loads(pickle.dumps(obj)) == obj


def test_a_field_outside_the_constructor_is_refused() -> None:
    with pytest.raises(TypeError, match="every field must be an __init__ argument"):

        @compact
        @dataclasses.dataclass
        class Derived:
            value: int
            double: int = dataclasses.field(init=False, default=0)
