"""Host and agent, end to end: the host creates the conversation's SandboxScope, the agent
acquires a sandbox under it, runs code that renders an artifact, collects the declared output into
a host directory, and the host deletes the scope (the operator disposes what it held).

    python docs/examples/host_agent.py --namespace agents --out ./landed

Run by tests/e2e/test_client_docs.py against the local cluster.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from sandbox_operator.client import SandboxClient, make_file_system_sink
from sandbox_operator.contract import Capability, DeclaredOutput, SandboxSpec

REPORT_CODE = """
import json, pathlib
rows = [{"n": n, "square": n * n} for n in range(1, 6)]
out = pathlib.Path("out")
out.mkdir(exist_ok=True)
(out / "report.json").write_text(json.dumps(rows))
print(f"wrote {len(rows)} rows")
"""


async def host_and_agent(namespace: str, kubeconfig: str | None, out: Path) -> list[str]:
    async with await SandboxClient.from_kubeconfig(namespace, kubeconfig=kubeconfig) as client:
        # Host: one SandboxScope per conversation. Scope and thread come from the host's own
        # request context, never from the model.
        scope_ref = await client.create_scope(scope="tenant-a", thread_id="thread-42")
        try:
            # Agent: names only the scope the host handed it.
            spec = SandboxSpec(
                kind="report",
                image="sandbox-operator.dev/python:1",
                requires=frozenset(
                    {
                        Capability.EXEC,
                        Capability.RUN_CODE,
                        Capability.FILES_IN,
                        Capability.FILES_OUT,
                    }
                ),
                declared_outputs=(
                    DeclaredOutput(
                        path="out/report.json", media_type="application/json", name="report.json"
                    ),
                ),
            )
            sandbox = await client.acquire(scope_ref, "reporter", spec, timeout=180)
            result = await sandbox.run_code(REPORT_CODE, timeout=60)
            print(result.stdout_text.strip())
            collected = await sandbox.collect_outputs(make_file_system_sink(out))
            return [artifact.display for artifact in collected.landed]
        finally:
            # Host: the conversation is over; the operator disposes every sandbox in the scope.
            await client.delete_scope(scope_ref, wait=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--kubeconfig", default=None)
    parser.add_argument("--out", type=Path, default=Path("landed"))
    args = parser.parse_args()
    for line in asyncio.run(host_and_agent(args.namespace, args.kubeconfig, args.out)):
        print(line)


if __name__ == "__main__":
    main()
