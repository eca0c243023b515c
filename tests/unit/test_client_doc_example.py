"""docs/client.md shows docs/examples/host_agent.py unchanged: the example a reader copies is the
one tests/e2e/test_client_docs.py runs against the operator."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs/examples/host_agent.py"


def test_doc_shows_the_example_verbatim() -> None:
    doc = (REPO / "docs/client.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, flags=re.S)
    assert EXAMPLE.read_text() in blocks
