"""Host tools: functions in the agent's process that model-written code in a sandbox may call.

:mod:`.registry` is the contract (declarations, the registry, one run's door, call records; no
I/O); :mod:`.channel` carries calls over exec and files, with :mod:`.layout` (where a run lives
in the sandbox) and :mod:`.guest` (the shim, launcher and scripts it runs there); :mod:`.errors`
holds the typed refusals.
See docs/host-tools.md.
"""

from sandbox_operator.client.hosttools.channel import (
    HostToolRunResult,
    reclaim_run,
    run_with_host_tools,
)
from sandbox_operator.client.hosttools.errors import (
    HostToolArgumentsInvalid,
    HostToolCallCapExceeded,
    HostToolCallRefused,
    HostToolChannelError,
    HostToolDeliveryUncertain,
    HostToolError,
    HostToolFailed,
    HostToolFileNameReserved,
    HostToolIdentityNotAllowed,
    HostToolNameInvalid,
    HostToolNotRegistered,
    HostToolRegistrationError,
    HostToolRegistrySealed,
    HostToolRequestInvalid,
    HostToolRequestTooLarge,
    HostToolResponseTooLarge,
    HostToolResultInvalid,
    HostToolRunTimeout,
    HostToolRunUnclean,
    HostToolSignatureInvalid,
    HostToolsWarning,
    HostToolUndeclared,
    SignalOutcome,
    UserIdentityUnavailable,
)
from sandbox_operator.client.hosttools.guest import host_tool_shim
from sandbox_operator.client.hosttools.layout import (
    RESERVED_NAMES,
    GuestRunLayout,
    guest_run_layout,
)
from sandbox_operator.client.hosttools.registry import (
    DEFAULT_MAX_HOST_TOOL_CALLS_PER_RUN,
    USER_IDENTITY_PARAMETER,
    Delivery,
    FlowDeclaration,
    HostToolAnswer,
    HostToolCallRecord,
    HostToolPolicy,
    HostToolRegistry,
    HostToolRun,
    Identity,
    RegisteredTool,
    host_tool,
)

__all__ = [
    "DEFAULT_MAX_HOST_TOOL_CALLS_PER_RUN",
    "RESERVED_NAMES",
    "USER_IDENTITY_PARAMETER",
    "Delivery",
    "FlowDeclaration",
    "GuestRunLayout",
    "HostToolAnswer",
    "HostToolArgumentsInvalid",
    "HostToolCallCapExceeded",
    "HostToolCallRecord",
    "HostToolCallRefused",
    "HostToolChannelError",
    "HostToolDeliveryUncertain",
    "HostToolError",
    "HostToolFailed",
    "HostToolFileNameReserved",
    "HostToolIdentityNotAllowed",
    "HostToolNameInvalid",
    "HostToolNotRegistered",
    "HostToolPolicy",
    "HostToolRegistrationError",
    "HostToolRegistry",
    "HostToolRegistrySealed",
    "HostToolRequestInvalid",
    "HostToolRequestTooLarge",
    "HostToolResponseTooLarge",
    "HostToolResultInvalid",
    "HostToolRun",
    "HostToolRunResult",
    "HostToolRunTimeout",
    "HostToolRunUnclean",
    "HostToolSignatureInvalid",
    "HostToolUndeclared",
    "HostToolsWarning",
    "Identity",
    "RegisteredTool",
    "SignalOutcome",
    "UserIdentityUnavailable",
    "guest_run_layout",
    "host_tool",
    "host_tool_shim",
    "reclaim_run",
    "run_with_host_tools",
]
