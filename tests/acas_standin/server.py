"""Run the stand-in: in the test's event loop (`async with StandinServer()`), in a thread of its
own (`with ThreadedStandin()`, for synchronous callers or a second process's worth of isolation),
or as a process (`python -m tests.acas_standin --port N`)."""

from __future__ import annotations

import asyncio
import threading
from types import TracebackType
from typing import Self

from aiohttp import web

from .app import make_app
from .state import StandinState

DEFAULT_TOKEN = "test-token"


class StandinServer:
    """A real HTTP server on 127.0.0.1 serving the stand-in API."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        tokens: tuple[str, ...] | None = (DEFAULT_TOKEN,),
        state: StandinState | None = None,
    ) -> None:
        self.state = state or StandinState(tokens=tokens)
        self._host = host
        self._port = port
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://{self._host}:{self.port}"

    async def start(self) -> str:
        self._runner = web.AppRunner(make_app(self.state), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        server = site._server
        assert server is not None
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1]
        return self.base_url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self.state.close()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


class ThreadedStandin:
    """The same server, on its own event loop in a daemon thread."""

    def __init__(self, **kw: object) -> None:
        self.server = StandinServer(**kw)  # type: ignore[arg-type]
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @property
    def state(self) -> StandinState:
        return self.server.state

    @property
    def base_url(self) -> str:
        return self.server.base_url

    def start(self) -> str:
        self._thread.start()
        return asyncio.run_coroutine_threadsafe(self.server.start(), self._loop).result(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
