"""``pace serve``: an OpenAI-compatible HTTP server with continuous batching.

Sub-packages, one job each:

* :mod:`.api`: the OpenAI HTTP API (``app``: FastAPI routes and error handlers; ``protocol``:
  request models and the error shape; ``openai_request`` / ``openai_response``: requests to
  prompts and ``SamplingConfig`` s, tokens to bodies and SSE chunks; ``delivery``: whole or
  streamed answers; ``tools``; ``tokenize_api``). The only place HTTP statuses live.
* :mod:`.frontdoor`: ``Server`` and its construction, ``frontend`` (routing, queue limits,
  event fan-out), ``routing`` (prefix-aware), ``metrics``, ``context`` (what the API reads of
  a server).
* :mod:`.launch`: ``cli`` (``pace serve``), the engine instances (``local``: a thread;
  ``multi``: pinned, restarted processes; ``ray_serve``: Ray Serve replicas) and
  ``instances`` (``EngineHandle``, ``Ready``, ``Dead``), ``testing`` (a server in a thread).

Each instance runs the engine core (:mod:`pace_core.engine`), the same one offline
generation uses.
"""
