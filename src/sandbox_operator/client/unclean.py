"""When a failed exec leaves its sandbox unclean: the one rule every surface applies.

A command the caller stops owning (cancelled, timed out, over its output budget, cut off from
its stream) runs on in the sandbox unless its process group is killed; the data plane sends the
kill and says what it reached (``kill_delivered``, ``kill_reach``). Anything short of a kill
delivered to the whole group (or a group found already ended, ``gone``) may leave something
running that no caller owns, so the sandbox is unclean: its handle refuses every further use and
a client-acquired Sandbox is disposed (:meth:`~sandbox_operator.client.Sandbox.exec_on_plane`).
The client's handle and the maf backend both go through that method, so the rule is judged here
and nowhere else.

Pure: it reads an exception's fields and decides nothing else.
"""

from __future__ import annotations

from sandbox_operator.client.errors import (
    ExecCancelled,
    ExecStreamLost,
    ExecTimeout,
    OutputBudgetExceeded,
)


def _reached_group(delivered: bool, reach: str) -> bool:
    """The kill reached the command's whole group (or, for a terminal session, every process of
    its session), or found it already ended (``gone``)."""
    return reach == "gone" or (delivered and reach in ("group", "session"))


def unclean_reason(exc: BaseException) -> str | None:
    """Why ``exc``, raised by a data plane's exec, leaves the sandbox unclean; None when it does
    not (the kill reached the command's group, the command had ended, or it never started)."""
    if isinstance(exc, ExecCancelled):
        if _reached_group(exc.kill_delivered, exc.kill_reach):
            return None
        return f"an exec was cancelled and its kill reached {exc.kill_reach}"
    if isinstance(exc, ExecTimeout):
        if _reached_group(exc.kill_delivered, exc.kill_reach):
            return None
        return f"an exec timed out and its kill reached {exc.kill_reach}"
    if isinstance(exc, OutputBudgetExceeded):
        if exc.ended or _reached_group(exc.kill_delivered, exc.kill_reach):
            return None
        return f"an exec went over its output budget and its kill reached {exc.kill_reach}"
    if isinstance(exc, ExecStreamLost):
        if _reached_group(exc.kill_delivered, exc.kill_reach):
            return None
        return f"an exec's stream was lost and its kill reached {exc.kill_reach}"
    return None


__all__ = ["unclean_reason"]
