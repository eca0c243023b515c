"""`python -m tests.acas_standin --port N [--token T ...] [--any-token]`: serve until killed."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal

from .server import DEFAULT_TOKEN, StandinServer


async def _serve(port: int, tokens: tuple[str, ...] | None) -> None:
    server = StandinServer(host="127.0.0.1", port=port, tokens=tokens)
    await server.start()
    print(f"acas stand-in listening on {server.base_url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.acas_standin")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument(
        "--token", action="append", help=f"accepted token (default {DEFAULT_TOKEN})"
    )
    parser.add_argument("--any-token", action="store_true", help="accept any non-empty token")
    args = parser.parse_args()
    tokens = None if args.any_token else tuple(args.token or (DEFAULT_TOKEN,))
    asyncio.run(_serve(args.port, tokens))


if __name__ == "__main__":
    main()
