"""The ports router (docs/ports.md): one asyncio HTTP/1.1 reverse proxy, a program of its own that
the chart installs (optional), forwarding ``/<namespace>/<sandbox>/<port>/<rest>`` to a declared
port of the Sandbox's pod, for callers the Kubernetes API authenticates (TokenReview) and
authorizes on that Sandbox (SubjectAccessReview), and waking a suspended Sandbox on the first
request. One job per module: the request target (:mod:`.target`), the request head
(:mod:`.head`), the watched view (:mod:`.view`), the reviews and their cache (:mod:`.reviews`),
wake-ups (:mod:`.wake`), activity stamps (:mod:`.activity`), the server (:mod:`.server`)."""
