"""maf tests run only where maf-sandbox is installed (``.venv-maf``, Python 3.12)."""

import pytest

pytest.importorskip("maf_sandbox")
