"""Run an app with uvicorn in a background thread on a free 127.0.0.1 port (tests, benchmarks)."""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn


class ThreadedServer:
    """``with ThreadedServer(app) as srv: srv.url`` -- uvicorn in a daemon thread."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, timeout: float = 60.0):
        self.config = uvicorn.Config(
            app, host=host, port=port, log_level="warning", lifespan="on", timeout_keep_alive=30
        )
        self.server = uvicorn.Server(self.config)
        self.timeout = timeout
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)
        self.host = host
        self.port = port

    def start(self) -> ThreadedServer:
        self.thread.start()
        deadline = time.monotonic() + self.timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        sock = self.server.servers[0].sockets[0]
        self.port = sock.getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(self.timeout)

    def __enter__(self) -> ThreadedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
