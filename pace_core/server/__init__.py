"""``pace serve``: an OpenAI-compatible HTTP server with continuous batching.

Modules, one job each:

* :mod:`.local` (``LocalEngine``, a thread) and :mod:`.multi` (``ProcessEngine``, a process
  per core group): engine instances, each running a :class:`~pace_core.engine.core.EngineCore`
  and speaking its typed events (:mod:`pace_core.engine.events`);
* :mod:`.instances`: what the front door knows of an instance (``EngineHandle``, ``Ready``,
  ``Dead``);
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
