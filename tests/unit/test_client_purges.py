"""What a conversation's disposal did, read off what the operator leaves (#25 item 3)."""

from __future__ import annotations

from sandbox_operator.client.purges import purge_of_scope, undisposed
from sandbox_operator.contract import DisposalCode, DisposalFailure, ScopePurge


def test_a_scopes_last_state_gives_its_purge() -> None:
    scope = {
        "status": {
            "lastPurge": {
                "disposed": 2,
                "undisposed": [{"code": "refused", "detail": "HTTP 403", "backend": "gvisor"}],
            }
        }
    }
    purge = purge_of_scope(scope)
    assert purge == ScopePurge(
        disposed=2,
        undisposed=(
            DisposalFailure(code=DisposalCode.REFUSED, detail="HTTP 403", backend="gvisor"),
        ),
    )
    assert not purge.complete
    assert purge_of_scope({"status": {}}) is None  # never purged by an operator
    assert purge_of_scope(None) is None
    assert purge_of_scope({"status": {"lastPurge": {"disposed": -1}}}) is None  # garbage


def test_a_sandbox_still_there_says_why_by_code() -> None:
    failed = {
        "metadata": {"name": "a"},
        "status": {
            "backend": "runc",
            "conditions": [
                {
                    "type": "Disposed",
                    "status": "False",
                    "reason": "DisposalFailed",
                    "message": "disposal failed (unreachable) on backend runc: deleting Pod x: "
                    "TimeoutError",
                }
            ],
        },
    }
    got = undisposed(failed, 30)
    assert (got.code, got.backend) == (DisposalCode.UNREACHABLE, "runc")
    assert got.detail == "deleting Pod x: TimeoutError"
    slow = {"metadata": {"name": "b"}, "status": {"backend": "gvisor", "conditions": []}}
    got = undisposed(slow, 30)
    assert (got.code, got.backend) == (DisposalCode.TIMEOUT, "gvisor")
    assert "b still present 30s" in got.detail
