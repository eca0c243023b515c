"""Kubernetes quantities in the subset the contract accepts, and the CPU/memory requests and
limits built from them, with the built-in defaults and ceilings."""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, localcontext
from typing import Annotated, Final

from pydantic import (
    BeforeValidator,
    Field,
    WithJsonSchema,
    model_validator,
)

from .base import ContractModel

QUANTITY_PATTERN: Final = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|Ki|Mi|Gi|Ti|Pi)?$"
_QUANTITY_RE: Final = re.compile(QUANTITY_PATTERN)
_SUFFIX: Final[dict[str, Decimal]] = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
}


#: Longest quantity string (the CRD's maxLength, so the API server and the model agree).
QUANTITY_MAX_LENGTH: Final = 64
#: Largest amount Kubernetes represents: a larger quantity is capped to it (apimachinery's
#: ``ParseQuantity``), so ``10^30`` and ``10^31`` compare equal on the API server.
QUANTITY_MAX: Final = Decimal(2**63 - 1)
#: Kubernetes rounds a quantity up to a whole nano unit.
_NANO: Final = Decimal("1e-9")


def parse_quantity(value: str) -> Decimal:
    """Value of a Kubernetes quantity in the subset this API accepts (e.g. ``500m``, ``1Gi``).

    Capped at :data:`QUANTITY_MAX` and rounded up to a nano unit exactly as the API server's
    ``quantity()`` does, so a comparison here (requests <= limits) agrees with the CRD's CEL rule.
    """
    match = _QUANTITY_RE.fullmatch(value)  # not .match: "$" also matches before a final "\n"
    if match is None:
        raise ValueError(f"{value!r} is not a quantity like 500m, 2, 256Mi or 1Gi")
    number = value[: len(value) - len(match.group(2) or "")]
    with localcontext() as ctx:
        ctx.prec = 2 * QUANTITY_MAX_LENGTH + 32  # exact for every string the pattern admits
        amount = min(Decimal(number) * _SUFFIX[match.group(2) or ""], QUANTITY_MAX)
        return amount.quantize(_NANO, rounding=ROUND_CEILING)


def _quantity_input(value: object) -> object:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        # The API server stores a whole JSON number (3.0) within int64 as the integer (3).
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value <= QUANTITY_MAX:
            raise ValueError(f"{value} is not a quantity: an integer amount is 0 to 2^63-1")
        value = str(value)
    if isinstance(value, str):
        if len(value) > QUANTITY_MAX_LENGTH:
            raise ValueError(f"a quantity is at most {QUANTITY_MAX_LENGTH} characters")
        parse_quantity(value)
    return value


Quantity = Annotated[
    str,
    BeforeValidator(_quantity_input),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [
                {"type": "integer", "minimum": 0},
                {"type": "string", "maxLength": QUANTITY_MAX_LENGTH},
            ],
            "pattern": QUANTITY_PATTERN,
        }
    ),
]


class ResourceList(ContractModel):
    """CPU and memory amounts (Kubernetes quantities)."""

    cpu: Quantity | None = Field(default=None, description="CPU, e.g. 500m or 2.")
    memory: Quantity | None = Field(default=None, description="Memory, e.g. 256Mi or 1Gi.")


#: Names of the resources a ResourceList carries, in the order they are reported.
RESOURCE_NAMES: Final[tuple[str, ...]] = ("cpu", "memory")

#: Requests a sandbox gets for what neither its spec nor the host policy states. Sized for an idle
#: sandbox (a sleeping shell holds ~2 MiB, an idle Python ~14 MiB) so that a node is not "full"
#: of sandboxes that do nothing: 100 of them reserve 1 CPU and 3.2 GiB. Runtime overhead (gVisor's
#: Sentry, a microVM) belongs in the RuntimeClass's ``overhead``, which Kubernetes adds on top.
DEFAULT_RESOURCE_REQUESTS: Final = ResourceList(cpu="10m", memory="32Mi")
#: Limits a sandbox gets for what neither its spec nor the host policy states: what one busy
#: sandbox may use at most.
DEFAULT_RESOURCE_LIMITS: Final = ResourceList(cpu="1", memory="512Mi")
#: Ceilings for a resource the host policy sets no ``maxLimits`` for (raised to the host's default
#: limit when that is larger): so an unconfigured host still refuses a spec asking 10^18 CPUs,
#: which the API server and the scheduler would otherwise take (the pod just never schedules).
#: A host that wants larger sandboxes says so in ``hostPolicy.resources.maxLimits``.
DEFAULT_RESOURCE_CEILING: Final = ResourceList(cpu="8", memory="16Gi")


def _amounts(rl: ResourceList) -> str:
    return " and ".join(f"{getattr(rl, r)} {r}" for r in RESOURCE_NAMES)


class ResourceRequirements(ContractModel):
    """CPU and memory requests and limits of the sandbox, as the spec states them.

    Anything left out is filled at admission from the host policy's defaults (see
    ``sandbox_operator.policy.resolve_resources``); the pod runs with the resolved values.
    """

    requests: ResourceList = Field(
        default_factory=ResourceList,
        description=(
            "Amounts reserved for the sandbox on its node; each at most its limit. What is left "
            "out gets the host's default request (unless configured: "
            f"{_amounts(DEFAULT_RESOURCE_REQUESTS)}), capped at the limit."
        ),
    )
    limits: ResourceList = Field(
        default_factory=ResourceList,
        description=(
            "Upper bounds the sandbox may not exceed. What is left out gets the host's default "
            f"limit (unless configured: {_amounts(DEFAULT_RESOURCE_LIMITS)}), raised to a "
            "larger stated request."
        ),
    )

    @model_validator(mode="after")
    def _requests_within_limits(self) -> ResourceRequirements:
        for resource in RESOURCE_NAMES:
            request = getattr(self.requests, resource)
            limit = getattr(self.limits, resource)
            if (
                request is not None
                and limit is not None
                and parse_quantity(request) > parse_quantity(limit)
            ):
                raise ValueError(
                    f"requests.{resource} ({request}) exceeds limits.{resource} ({limit})"
                )
        return self
