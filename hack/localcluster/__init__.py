"""The local Kubernetes cluster behind `hack/cluster.py`, one concern per module.

`hack/cluster.py` is the command (argument parsing and the `up`, `down`, `status`, `images`,
`kwok` and `restart` commands); what it drives lives here, so that each piece reads on its own:

- layout: the state directory, its files, ports and addresses (one place moves them all)
- steps: progress lines, failures that name their step and log, running commands
- binaries: the binaries built from the Go module proxy, the Debian packages
- pki: the throwaway CA, the certificates and the kubeconfigs
- supervise: processes started detached, recorded by pid, health-checked, stopped by pid
- probes: health checks and the admin user's API client
- control_plane, node, containerd: what each component is started with
- hostnet: the host's kernel settings and the iptables guard for Service IPs
- objects: the API objects `up` creates (RuntimeClasses, StorageClass)
- kwok: fake nodes for scale tests
- machine: whether this machine could run a microVM
- teardown: stopping containers, unmounting and deleting the state

Only the standard library is used, so any python3 runs it.
"""
