"""Every python3 the project starts inside a sandbox for itself runs isolated (``-I``): the
sandbox's writable home is the agent's, and a ``usercustomize`` planted in its user site would
otherwise run in the exec wrapper before every later command, in the host-tools launcher, in the
exec session's launcher (#39 item 2), and in the egress probe (#25 item 7;
tests/e2e/test_host_tools.py step 3d proves it on a real node)."""

from __future__ import annotations

import re

from sandbox_operator.client.dataplane import launcher, scripts
from sandbox_operator.client.hosttools import guest
from sandbox_operator.egress.probe import ProbeTarget, probe_argv


def test_the_exec_wrapper_the_launcher_and_the_probe_start_python_isolated() -> None:
    for script in (scripts.EXEC_OUTER, guest.START, launcher.START):
        flags = re.findall(r"python3((?: -\w+)+)", script)  # each invocation's flags
        assert flags and all("-I" in f.split() for f in flags), (script, flags)
    argv = probe_argv([ProbeTarget(name="t", host="example.test", port=443)])
    assert argv[:2] == ["python3", "-I"]
