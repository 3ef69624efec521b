"""uvicorn on a daemon thread, for tests and notebooks."""

from __future__ import annotations

import threading
import time

import uvicorn
from fastapi import FastAPI


class BackgroundServer:
    """uvicorn on a daemon thread (tests, notebooks): `with BackgroundServer(app) as srv: srv.url`.
    Port 0 (default) binds a free port, read back once the server listens."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> None:
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on",
                                timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="hotspec-uvicorn", daemon=True)
        self.host = host
        self.port = port

    def __enter__(self) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the HTTP server did not start (see the log above)")
            time.sleep(0.02)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"
