"""The operator SIGKILLed at random points during a burst of creates on the real node (runc),
smaller than the kwok run of tests/integration/test_faults_operator.py: every Sandbox Ready with
one pod ever, nothing orphaned. The run itself is tests/fixtures/sigkill.py.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.fixtures.faults import runc_config, terminal
from tests.fixtures.sigkill import sigkill_burst

# exclusive: kills the operator during a burst (run alone, after the concurrent part).
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.exclusive]


@pytest.fixture
def say(request: pytest.FixtureRequest) -> Callable[[str], None]:
    return terminal(request.config)


def test_sigkill_at_random_points_during_creates_on_runc(
    kit, start_operator, api_client, kubectl, monkeypatch, say
):
    """The same on the real node (runc), smaller: 12 creates, 2 SIGKILLs."""
    sigkill_burst(
        kit,
        start_operator,
        monkeypatch,
        say,
        api_client,
        kubectl,
        runc_config(),
        creates=12,
        kills=2,
        pace=0.5,
        converge_timeout=150,
        label="sigkill/runc",
    )
