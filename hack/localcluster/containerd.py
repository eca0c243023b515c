"""containerd, the node's container runtime: its configuration (CRI with the `runc` and `runsc`
handlers, the CNI bridge), the wrapper that lets containerd 1.6's runc v2 shim drive gVisor, its
client (`ctr`) and the import of the locally built images.

The configuration and the wrapper are plain files beside this module (containerd.toml,
runsc-wrapper.sh), read when `up` writes them, with their @PLACEHOLDERS@ filled in; see
docs/cluster.md, "How gVisor runs here".

containerd 1.6 runs gVisor through its runc v2 shim (gVisor's own shim speaks a newer protocol).
runsc speaks runc's command line, with two differences the wrapper bridges:

- runc gives a container its stdio at `create`; runsc takes a pod's app container's stdio from
  the `start` process, whose output the shim captures into a pipe of its own (the container's
  output would land there, and the shim, waiting for that pipe's EOF, hangs StartContainer).
  So at `create` a holder process keeps the container's stdio open and `start` runs with it.
- runsc reports the sandbox's pid for an app container, so the shim would only see the
  container exit when the whole pod ends. A watcher process (`runsc wait`, exiting with the
  container's status) stands in as the container's pid.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from .binaries import Bins
from .layout import (
    BRIDGE,
    CONTAINERD_DIR,
    CONTAINERD_SOCK,
    HACK,
    IMAGES,
    LOGS,
    POD_SUBNET,
    STATE,
)
from .probes import containerd_healthy
from .steps import StepFailed, run, step, write_file
from .supervise import Proc

#: The directory of the template files.
HERE = Path(__file__).resolve().parent


def render(template: str, **values: str) -> str:
    """The template file beside this module, each `@KEY@` replaced by its value."""
    text = (HERE / template).read_text()
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    return text


def write_containerd_config(bins: Bins) -> Path:
    root = CONTAINERD_DIR
    cni_conf = STATE / "cni" / "net.d"
    cni_conf.mkdir(parents=True, exist_ok=True)
    conflist = {
        "cniVersion": "0.4.0",
        "name": "sandbox-operator",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                # No masquerade: pods reach this node (API server, proxies on it), nothing beyond.
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(STATE / "cni" / "networks"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    write_file(cni_conf / "10-sandbox-operator.conflist", json.dumps(conflist, indent=2) + "\n")
    # runsc's global flags go before the runc-style subcommand the shim passes: a wrapper.
    # `touch $STATE/runsc-debug` (then `up`) writes gVisor's debug logs to logs/runsc/.
    runsc_flags = ["--platform=systrap"]
    if (STATE / "runsc-debug").exists():
        (LOGS / "runsc").mkdir(parents=True, exist_ok=True)
        runsc_flags += ["--debug", f"--debug-log={LOGS / 'runsc'}/%ID%.%COMMAND%.log"]
    runsc = root / "runsc-wrapper"
    runsc.parent.mkdir(parents=True, exist_ok=True)
    exe = f"{bins.gvisor / 'runsc'} {' '.join(runsc_flags)}"
    holders = root / "runsc-stdio"
    holders.mkdir(parents=True, exist_ok=True)
    wrapper = render("runsc-wrapper.sh", RUNSC=exe, DIR=str(holders))
    write_file(runsc, wrapper, 0o755)
    config = render(
        "containerd.toml",
        ROOT=str(root),
        SOCKET=str(CONTAINERD_SOCK),
        PAUSE_IMAGE=IMAGES["pause"],
        RUNSC_WRAPPER=str(runsc),
        CNI_CONF=str(cni_conf),
    )
    path = root / "config.toml"
    write_file(path, config)
    return path


def containerd_proc(config: Path) -> Proc:
    return Proc(
        "containerd",
        ["/usr/bin/containerd", f"--config={config}", "--log-level=warn"],
        containerd_healthy,
        # Not the runsc wrapper: shims run it afresh for every call, no restart needed.
        inputs=(config, *sorted((STATE / "cni" / "net.d").glob("*"))),
    )


def ctr(*args: str, log: Path | None = None, check: bool = True, timeout: float = 120) -> str:
    argv = ["ctr", "--address", str(CONTAINERD_SOCK), "-n", "k8s.io", *args]
    try:
        return run(argv, log=log, check=check, timeout=timeout)
    except subprocess.TimeoutExpired:
        if check:
            raise StepFailed("ctr", f"`ctr {' '.join(args[:2])}` timed out", log) from None
        return ""


def import_images() -> None:
    log = LOGS / "images.log"
    with step("build images from Debian packages (cached)", log):
        out = run(
            ["bash", str(HACK / "images.sh"), "build"],
            env=dict(os.environ, CONTAINERD_ADDRESS=str(CONTAINERD_SOCK)),
        )
    tarballs = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    present = set(ctr("images", "ls", "-q").split())
    record = STATE / "images.imported"
    done = json.loads(record.read_text()) if record.exists() else {}
    todo = {ref: tar for ref, tar in tarballs.items() if ref not in present or done.get(ref) != tar}
    if not todo:
        return
    with step(f"import images into containerd: {' '.join(todo)}", log):
        for ref, tar in todo.items():
            ctr("images", "import", tar, log=log)
            if ref not in ctr("images", "ls", "-q").split():
                raise StepFailed("import images", f"{ref} missing after import", log)
            done[ref] = tar
        record.write_text(json.dumps(done, indent=2))
