"""A published kind runs unchanged on this backend: maf-sandbox-codeact's ``execute_code`` tool,
built by its own factory over ``maf_sandbox.SandboxRouter`` on :class:`OperatorBackend`, called
directly (no model) with a small program, on gVisor (and runc: the same module fixture).

Nothing here knows the backend beyond the router: the tool asks for its sandbox with
``codeact_sandbox_spec`` (the image given is this cluster's python image) and runs the program
over exec, as it would on any maf backend.
"""

from __future__ import annotations

import uuid
from typing import Any

import maf_sandbox as maf
import pytest
from maf_sandbox.maf import make_caller_context
from tests.fixtures.maf_cluster import Served
from tests.fixtures.operator import PYTHON

codeact = pytest.importorskip("maf_sandbox_codeact")

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


async def _no_files(_store: Any) -> list[maf.ListedFile]:
    return []


def _text(contents: Any) -> str:
    """The tool's result as text, whatever Content items it came back as."""
    if isinstance(contents, str):
        return contents
    parts = []
    for item in contents if isinstance(contents, list) else [contents]:
        text = getattr(item, "text", None)
        parts.append(text if isinstance(text, str) else repr(item))
    return "\n".join(parts)


async def test_codeact_execute_code_runs_a_program(
    served: Served, router: maf.SandboxRouter, backend: Any
) -> None:
    thread = f"codeact-{uuid.uuid4().hex[:8]}"
    context = make_caller_context(_no_files, lambda: "maf-tier", lambda: thread)
    tools = codeact.make_codeact_tools(router, "codeact-agent", context, image=PYTHON)
    assert len(tools) == 1, "no execute_code tool: the router cannot serve codeact's spec"
    tool = tools[0]
    program = "import sys\nprint(sum(i * i for i in range(10)), sys.version_info[0])\n"
    try:
        result = await tool.invoke(arguments={"code": program})
        text = _text(result)
        assert "285 3" in text, text
    finally:
        await router.dispose_scope("maf-tier", thread)
