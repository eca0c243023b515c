"""The client is composed, not stacked (#27 item 4): ``SandboxClient`` holds one object per job
(its API calls, its watches, its suspensions, its scopes, its egress feed, its data planes, its
acquires, its disposals, its scope purges) and inherits from none of them; none of them inherits
from another or knows the client; and the plane a handle gets is a ``DataPlane`` with the
protocol's own signatures, not ``*args: Any`` forwarding."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import sandbox_operator.client as client_pkg
from sandbox_operator.client import SandboxClient
from sandbox_operator.client.acquire import Acquisitions
from sandbox_operator.client.dataplane import DataPlane
from sandbox_operator.client.disposal import Disposals
from sandbox_operator.client.egress import EgressFeed
from sandbox_operator.client.kube import SandboxObjects
from sandbox_operator.client.planes import DataPlanes
from sandbox_operator.client.purges import ScopePurges
from sandbox_operator.client.scopes import Scopes
from sandbox_operator.client.served import ServedPlane
from sandbox_operator.client.suspension import Suspensions
from sandbox_operator.client.watching import Watches

#: The client and the parts it is composed of.
PARTS: tuple[type, ...] = (
    SandboxClient,
    SandboxObjects,
    Watches,
    Suspensions,
    Scopes,
    EgressFeed,
    ServedPlane,
    DataPlanes,
    Acquisitions,
    Disposals,
    ScopePurges,
)

#: The modules of the parts: none may import the client's module (a part that knows the client
#: is the stack again, by another road).
PART_MODULES = (
    "kube",
    "watching",
    "suspension",
    "scopes",
    "egress",
    "served",
    "planes",
    "acquire",
    "disposal",
    "purges",
)

#: The methods of the DataPlane protocol.
PLANE_METHODS = ("exec", "write_file", "read_file", "stat", "list_dir", "remove", "close")


def _client_classes() -> list[type]:
    """Every class defined in a module of sandbox_operator.client (subpackages included)."""
    found: list[type] = []
    for info in pkgutil.walk_packages(client_pkg.__path__, f"{client_pkg.__name__}."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__:
                found.append(cls)
    return found


@pytest.mark.parametrize("part", PARTS, ids=lambda c: c.__name__)
def test_no_part_inherits_anything(part: type) -> None:
    assert part.__mro__ == (part, object), (
        f"{part.__name__} inherits {[c.__name__ for c in part.__mro__[1:-1]]}: "
        "hold the other part as an attribute instead"
    )


def test_no_class_of_the_client_package_inherits_a_part() -> None:
    offenders = [
        f"{cls.__module__}.{cls.__qualname__} inherits {base.__name__}"
        for cls in _client_classes()
        for base in PARTS
        if cls is not base and issubclass(cls, base)
    ]
    assert offenders == []


@pytest.mark.parametrize("module", PART_MODULES)
def test_no_part_knows_the_client(module: str) -> None:
    path = Path(client_pkg.__file__).parent / f"{module}.py"
    imported: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
            imported.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
    assert "sandbox_operator.client.client" not in imported, (
        f"sandbox_operator.client.{module} imports the client: give it what it needs instead"
    )


@pytest.mark.parametrize("method", PLANE_METHODS)
def test_the_served_plane_has_the_protocol_signatures(method: str) -> None:
    expected = inspect.signature(getattr(DataPlane, method))
    actual = inspect.signature(getattr(ServedPlane, method))
    assert actual == expected, (
        f"ServedPlane.{method}{actual} is not DataPlane.{method}{expected}: "
        "a served plane forwards the protocol's own arguments, typed"
    )


def test_the_served_plane_is_given_what_it_needs_not_the_handle_or_the_client() -> None:
    params = inspect.signature(ServedPlane).parameters
    assert set(params) == {
        "inner",
        "served_by",
        "sandbox",
        "namespace",
        "connect",
        "resume",
        "is_suspended",
    }
    for name, param in params.items():
        kinds = {part.strip() for part in str(param.annotation).split("|")}
        assert not kinds & {"Sandbox", "SandboxClient"}, f"ServedPlane({name}=...) is {kinds}"


async def test_an_acquire_waits_for_an_unclean_handles_background_disposal() -> None:
    """An unclean handle disposes of its Sandbox in the background; the next acquire of that
    name must not apply before that DELETE lands, or it gets the unclean sandbox back (seen on
    the real node, 2026-12-07: tests/e2e/test_client_unclean.py, runc-stream)."""
    import asyncio
    from types import SimpleNamespace
    from typing import Any

    from sandbox_operator.client.acquire import Acquisitions
    from sandbox_operator.client.disposal import Disposals

    order: list[tuple[str, str]] = []

    class Stop(Exception):
        pass

    class Objects:
        async def delete(self, plural: str, name: str, view: Any, uid: str | None = None) -> None:
            await asyncio.sleep(0.05)  # the DELETE's round trip
            order.append(("delete", name))

        async def apply_created(self, plural: str, name: str, body: Any, view: Any) -> Any:
            order.append(("apply", name))
            raise Stop

    feed: Any = SimpleNamespace(observer=None, forget=lambda name, uid: None)
    disposals = Disposals(Objects(), None, SimpleNamespace(activity_stamps={}), feed)  # type: ignore[arg-type]
    acquisitions = Acquisitions(
        Objects(),
        None,
        None,
        feed,
        None,
        None,
        settled=disposals.settled,  # type: ignore[arg-type]
    )
    disposals.dispose_soon("sbx-a")
    assert "sbx-a" in disposals.in_flight  # registered before any await
    with pytest.raises(Stop):
        await acquisitions.wait_ready("sbx-a", "conv", {}, {})
    assert order == [("delete", "sbx-a"), ("apply", "sbx-a")]
    assert not disposals.in_flight
