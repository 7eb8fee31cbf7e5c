"""``pace serve``: an OpenAI-compatible HTTP server with continuous batching.

Modules: :mod:`~pace_core.server.engine` (scheduler + model loop), :mod:`.frontend`
(routing, queue limits, metrics bookkeeping), :mod:`.app` (FastAPI handlers),
:mod:`.protocol` (request models, error shape), :mod:`.multi` (engine processes),
:mod:`.metrics`, :mod:`.cli` (``add_serve_parser``), :mod:`.testing` (run in a thread).
"""
