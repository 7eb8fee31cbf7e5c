"""The OpenAI HTTP API: routes, request models and errors, request -> prompts and sampling
configs, engine tokens -> bodies and SSE chunks, delivery, tools, /tokenize."""
