"""`sandbox-operator check-egress` forwards to the egress probe rather than re-declaring it."""

import pytest

from sandbox_operator.cli import main


def test_check_egress_forwards_its_flags_to_the_probe(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["check-egress"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    # The probe's own parser answers: it names the flags it requires.
    assert "--namespace" in err and "--sandbox" in err


def test_check_egress_is_listed_in_the_cli_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "check-egress" in capsys.readouterr().out
