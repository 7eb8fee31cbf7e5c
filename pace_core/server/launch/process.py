"""The server process's lifetime: uvicorn serves until it is stopped (a signal) or until every
engine instance has given up, when the process exits with status 1 so that whatever
supervises it (systemd, Kubernetes, a shell loop) sees the failure, as vLLM's server exits
when its engine dies, rather than answering 503 forever."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pace_core.server.frontdoor.frontend import Frontend

log = logging.getLogger("pace.server")

EXIT_GAVE_UP = 1


def serve_http(app: Any, frontend: Frontend, host: str, port: int, log_level: str,
               interval: float = 1.0) -> int:  # fmt: skip
    """Serve ``app`` with uvicorn in this thread; the exit status: 0 once stopped (SIGINT,
    SIGTERM), :data:`EXIT_GAVE_UP` when every engine instance gave up (checked every
    ``interval`` s)."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level))
    status = 0
    done = threading.Event()

    def watch() -> None:
        nonlocal status
        while not done.wait(interval):
            reason = frontend.gave_up
            if reason is not None:
                log.error("every engine instance has given up, so pace serve exits: %s", reason)
                status = EXIT_GAVE_UP
                server.should_exit = True
                return

    watcher = threading.Thread(target=watch, name="pace-instances-watch", daemon=True)
    watcher.start()
    try:
        server.run()
    except KeyboardInterrupt:  # Ctrl+C: uvicorn shut down, then re-raised it (as uvicorn.run)
        pass
    finally:
        done.set()
        watcher.join()
    return status
