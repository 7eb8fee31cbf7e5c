"""``pace serve``: an OpenAI-compatible HTTP server with continuous batching.

Modules, one job each:

* :mod:`~pace_core.server.engine`: the scheduler and model loop (``EngineCore``);
  :mod:`.speculative` its speculative decode step;
* :mod:`.local` (``LocalEngine``, a thread) and :mod:`.multi` (``ProcessEngine``, a process
  per core group): the engine instances, both :class:`~.events.EngineHandle` s;
* :mod:`.events`: the typed messages between engines and front door (picklable dataclasses);
* :mod:`.frontend`: routing, queue limits, event fan-out, metrics bookkeeping;
* :mod:`.server`: ``Server`` / ``ServerConfig`` and how they are built (in-process or
  multi-instance);
* :mod:`.openai_request` (request -> prompts, ``SamplingConfig`` s, submission),
  :mod:`.openai_response` (tokens -> OpenAI bodies, SSE chunks, logprobs, usage),
  :mod:`.delivery` (wait on a submission: whole answer or stream, timeout, disconnect);
* :mod:`.app`: the FastAPI app (routes, API-key dependency, error handlers, OpenAPI);
* :mod:`.protocol` (request models, error shape), :mod:`.metrics`, :mod:`.cli`
  (``add_serve_parser``), :mod:`.testing` (run in a thread).
"""
