"""``sandbox-operator shell``'s command line (#39 item 1): everything after ``--`` is the command,
verbatim, whatever it looks like; without one it is ``sh``; ``-t``/``-T`` force the mode. The
session itself runs on the real node in tests/e2e/test_client_streaming.py."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox_operator import cli
from sandbox_operator.client import terminal


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    calls: list[Any] = []

    def fake_main(args: Any) -> int:
        calls.append(args)
        return 7

    monkeypatch.setattr(terminal, "main", fake_main)
    return calls


def test_the_command_after_dashes_is_passed_verbatim(seen: list[Any]) -> None:
    code = cli.main(["shell", "box", "-n", "ns", "--", "sh", "-c", "echo -n x", "--", "-T"])
    assert code == 7
    (args,) = seen
    assert (args.sandbox, args.namespace, args.tty) == ("box", "ns", None)
    assert args.argv == ["sh", "-c", "echo -n x", "--", "-T"]


def test_without_a_command_it_is_sh_and_the_mode_can_be_forced(seen: list[Any]) -> None:
    cli.main(["shell", "box", "-T"])
    cli.main(["shell", "box", "--tty"])
    assert [a.argv for a in seen] == [[], []]  # terminal.main runs ``sh`` for an empty one
    assert [a.tty for a in seen] == [False, True]


def test_the_namespace_is_the_kubeconfig_contexts_as_kubectl_reads_it(tmp_path: Any) -> None:
    """Without ``-n``, the chosen context's namespace (the current one's without ``--context``);
    ``default`` for a context that names none, one that does not exist, or no kubeconfig."""
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: here\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts:\n"
        "- {name: here, context: {cluster: c, user: u, namespace: ns-here}}\n"
        "- {name: there, context: {cluster: c, user: u, namespace: ns-there}}\n"
        "- {name: bare, context: {cluster: c, user: u}}\n"
    )
    path = str(kubeconfig)
    assert terminal._namespace(path, None) == "ns-here"
    assert terminal._namespace(path, "there") == "ns-there"
    assert terminal._namespace(path, "bare") == "default"
    assert terminal._namespace(path, "nowhere") == "default"
    assert terminal._namespace(str(tmp_path / "missing"), None) == "default"
