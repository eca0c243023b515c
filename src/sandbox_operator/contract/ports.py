"""The ports a workload serves (``spec.ports``): each named, numbered and with its application
protocol, reachable only through the operator's router (docs/ports.md).

Its own module because what a port may be called and numbered is a rule of its own that three
sides rely on: the pod's container ports (their names must be valid Kubernetes port names), the
router (which forwards only to a declared port) and the Sandbox's status (each port's URL).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from pydantic import Field

from .base import ContractModel

#: Most ports one spec declares: the namespace's ingress policy names each pod's ports by their
#: index (:func:`port_slot_name`), so the policy is one per namespace and lists this many.
PORTS_MAX_ITEMS: Final = 8
#: A Kubernetes port name (IANA_SVC_NAME): lowercase letters, digits and single hyphens, starting
#: with a letter, at most 15 characters.
PORT_NAME_PATTERN: Final = r"^[a-z](-?[a-z0-9])*$"
PORT_NAME_MAX_LENGTH: Final = 15
#: The TCP port range a declared port is in.
PORT_MIN: Final = 1
PORT_MAX: Final = 65535
#: Container-port names the pod builder gives the declared ports, in order (the user's names
#: live in the Sandbox; the pod's names are fixed so one NetworkPolicy per namespace can admit
#: the router to exactly the declared ports by name).
PORT_SLOT_PREFIX: Final = "sbx-port-"


class PortProtocol(StrEnum):
    """The application protocol a port speaks, spelled as Kubernetes' ``appProtocol`` names
    them: ``http`` (HTTP/1.1, WebSocket upgrades included) or ``tcp`` (a byte stream)."""

    HTTP = "http"
    TCP = "tcp"


class SandboxPort(ContractModel):
    """One port the workload serves on its pod's address."""

    name: str = Field(
        min_length=1,
        max_length=PORT_NAME_MAX_LENGTH,
        pattern=PORT_NAME_PATTERN,
        description=(
            "The port's name (a Kubernetes port name: lowercase letters, digits and single "
            "hyphens, starting with a letter, at most 15 characters); unique in the spec."
        ),
    )
    port: int = Field(
        ge=PORT_MIN,
        le=PORT_MAX,
        description="The TCP port the workload listens on in its pod (1-65535); unique.",
    )
    protocol: PortProtocol = Field(
        default=PortProtocol.HTTP,
        description=(
            "http (default: HTTP/1.1 and WebSocket upgrades, forwarded by the router) or tcp "
            "(declared and admitted by the network policy; the router does not forward it yet)."
        ),
    )


def port_slot_name(index: int) -> str:
    """The container-port name of the spec's ``index``-th declared port."""
    if not 0 <= index < PORTS_MAX_ITEMS:
        raise ValueError(f"a spec declares at most {PORTS_MAX_ITEMS} ports")
    return f"{PORT_SLOT_PREFIX}{index}"


def ports_problem(ports: tuple[SandboxPort, ...]) -> str | None:
    """Why a spec's ports cannot all be served (a name or number declared twice); None if they
    can."""
    names = [p.name for p in ports]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        return f"ports declares the name {', '.join(twice)} more than once"
    numbers = [p.port for p in ports]
    again = sorted({n for n in numbers if numbers.count(n) > 1})
    if again:
        return f"ports declares port {', '.join(map(str, again))} more than once"
    return None


class PortStatus(ContractModel):
    """A declared port as the Sandbox's status reports it: where a caller reaches it."""

    name: str = Field(max_length=PORT_NAME_MAX_LENGTH, description="The declared port's name.")
    port: int = Field(ge=PORT_MIN, le=PORT_MAX, description="The declared port's number.")
    protocol: PortProtocol = Field(description="The declared port's protocol.")
    url: str | None = Field(
        default=None,
        max_length=2048,
        description=(
            "The port's address through the router (<base>/<namespace>/<sandbox>/<name>/); unset "
            "while no router is configured, and for tcp ports (not forwarded yet)."
        ),
    )


def port_url(base_url: str, namespace: str, sandbox: str, port: str) -> str:
    """The router's address of one port of a Sandbox (``base_url`` without a trailing slash is
    the router's external address, e.g. ``https://sandboxes.example.com``)."""
    return f"{base_url.rstrip('/')}/{namespace}/{sandbox}/{port}/"


def port_statuses(
    ports: tuple[SandboxPort, ...], base_url: str | None, namespace: str, sandbox: str
) -> list[PortStatus]:
    """``status.ports`` for a spec's ports: a URL for each http port once a router is set."""
    return [
        PortStatus(
            name=p.name,
            port=p.port,
            protocol=p.protocol,
            url=(
                port_url(base_url, namespace, sandbox, p.name)
                if base_url and p.protocol is PortProtocol.HTTP
                else None
            ),
        )
        for p in ports
    ]
