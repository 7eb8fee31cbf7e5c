"""The :class:`Server` (what the HTTP routes work with) and how it is built.

:meth:`Server.in_process` runs one engine thread on an already loaded
:class:`~pace_core.engine.llm.LLMModel` (the default); :meth:`Server.multi_instance` launches
engine processes placed by a launch plan (:mod:`pace_core.platform.placement`,
:mod:`pace_core.server.launch.multi`) and loads only the tokenizer. Both take the context
window and the generation defaults from :mod:`pace_core.models.limits`, the rules the engines
themselves use.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pace_core.engine.config import EngineConfig
from pace_core.errors import PaceError
from pace_core.models.embedding import EmbeddingConfig, read_embedding_config
from pace_core.models.limits import (
    read_generation_config,
    resolve_eos_ids,
    serving_context_window,
    text_config,
)
from pace_core.platform.placement import InstancePlan
from pace_core.sampling.grammar import GrammarCompiler
from pace_core.server.api.openai_request import sampling_defaults
from pace_core.server.frontdoor.context import ServerConfig, TokenText
from pace_core.server.frontdoor.frontend import Frontend
from pace_core.server.frontdoor.metrics import Metrics
from pace_core.server.launch.instances import EngineHandle
from pace_core.server.launch.local import LocalEngine


class Server:
    """The tokenizer, the engine instances behind a :class:`Frontend`, the metrics and the
    model's limits; see :func:`~pace_core.server.api.app.create_app`."""

    def __init__(
        self,
        tokenizer: Any,
        instances: Sequence[EngineHandle],
        engine_config: EngineConfig,
        config: ServerConfig,
        *,
        max_context: int,
        vocab_size: int,
        generation_config: dict[str, Any] | None = None,
        eos_token_ids: Sequence[int] = (),
        speculative: bool = False,
        grammar: GrammarCompiler | None = None,
        embedding: EmbeddingConfig | str = "the server was built without embedding rules",
    ) -> None:
        self.tokenizer = tokenizer
        self.config = config
        self.engine_config = engine_config
        self.max_context = max_context
        self.vocab_size = vocab_size
        self.gen_defaults = sampling_defaults(generation_config)
        self.speculative = speculative
        self.embedding = embedding
        self.metrics = Metrics(speculative)
        self.frontend = Frontend(
            instances,
            self.metrics,
            max_running=engine_config.max_running,
            max_queue=engine_config.max_queue,
        )
        # a request's text work (encoding, chat template, grammar check) runs on one thread
        # of its own, off the event loop that streams every other request's tokens; the
        # loop's logprob text decodes with a copy of the tokenizer
        self.text_worker = ThreadPoolExecutor(1, thread_name_prefix="pace-text")
        self.token_text = TokenText(copy_tokenizer(tokenizer))
        eos = list(eos_token_ids) or [0]
        self.grammar = grammar or GrammarCompiler(tokenizer, vocab_size, eos)
        self.created = int(time.time())

    @property
    def model_names(self) -> tuple[str, ...]:
        return (self.config.served_model_name, *self.config.aliases)

    # -- constructors ----------------------------------------------------------------------
    @classmethod
    def in_process(
        cls, llm: Any, engine_config: EngineConfig | None = None, config: ServerConfig | None = None
    ) -> Server:
        """One engine thread on an already loaded :class:`~pace_core.engine.llm.LLMModel`."""
        engine_config = engine_config or EngineConfig()
        instance = LocalEngine(llm.handle, engine_config, "0")
        # the engine thread decodes with llm.tokenizer, the front door with its own copy
        return cls(
            copy_tokenizer(llm.tokenizer),
            [instance],
            engine_config,
            config or ServerConfig(),
            max_context=llm.handle.serving_context(),
            vocab_size=llm.model.vocab_size,
            generation_config=llm.generation_config,
            eos_token_ids=llm.eos_token_ids,
            speculative=llm.speculator is not None,
            grammar=llm.grammar,  # one conversion shared by the front door and the engine
            embedding=embedding_rules(lambda: llm.embedding_head.config),
        )

    @classmethod
    def multi_instance(
        cls,
        model_args: dict[str, Any],
        instances: int | str | Sequence[InstancePlan],
        engine_config: EngineConfig | None = None,
        config: ServerConfig | None = None,
        cores: list[int] | None = None,
    ) -> Server:
        """Engine processes placed by a launch plan (``instances``: a count, ``"auto"`` /
        ``"auto-l3"`` planned on this machine's topology, restricted to ``cores`` if given,
        or the plans themselves); loads only the tokenizer (the processes start with the
        app, see :meth:`Frontend.start`)."""
        from pace_core.platform import current_topology, read_topology
        from pace_core.platform.placement import plan_instances
        from pace_core.server.launch.multi import ProcessEngine

        engine_config = engine_config or EngineConfig()
        model_args = resolved_model_args(model_args)
        if isinstance(instances, (int, str)):
            topology = current_topology() if cores is None else read_topology(allowed=cores)
            instances = plan_instances(topology, instances)
        engines = [
            ProcessEngine(str(i), model_args, engine_config, plan)
            for i, plan in enumerate(instances)
        ]
        return cls.for_engines(model_args, engines, engine_config, config)

    @classmethod
    def for_engines(
        cls,
        model_args: dict[str, Any],
        engines: Sequence[EngineHandle],
        engine_config: EngineConfig,
        config: ServerConfig | None = None,
    ) -> Server:
        """A front door for engines that load the model elsewhere (processes, Ray Serve
        replicas): loads only the tokenizer and the model's limits from its directory."""
        from pace_core.models.loader import load_config, load_tokenizer

        path = Path(model_args["model"])
        hf_config = load_config(path)
        tokenizer = load_tokenizer(path)
        vocab = getattr(text_config(hf_config), "vocab_size", None) or len(tokenizer)
        generation_config = read_generation_config(path)
        return cls(
            tokenizer,
            engines,
            engine_config,
            config or ServerConfig(),
            max_context=serving_context_window(hf_config),
            vocab_size=int(vocab),
            generation_config=generation_config,
            eos_token_ids=resolve_eos_ids(generation_config, hf_config, tokenizer),
            speculative=model_args.get("spec_config") is not None,
            embedding=embedding_rules(lambda: read_embedding_config(path, hf_config)),
        )


def embedding_rules(read: Callable[[], EmbeddingConfig]) -> EmbeddingConfig | str:
    """The model's embedding rules, or why it cannot embed (``/v1/embeddings`` answers it)."""
    try:
        return read()
    except PaceError as exc:
        return str(exc)


def copy_tokenizer(tokenizer: Any) -> Any:
    """A copy for another thread: a Rust-backed tokenizer used by two threads at once can
    raise "Already borrowed" (transformers resets truncation/padding state on encode)."""
    try:
        return copy.deepcopy(tokenizer)
    except Exception:  # pragma: no cover - an exotic tokenizer that cannot be copied
        return tokenizer


def resolved_model_args(model_args: dict[str, Any]) -> dict[str, Any]:
    """``LLMModel`` keyword arguments with the model resolved to a local directory (zoo names,
    hub ids) once, so every engine loads the same files quietly."""
    from pace_core.models.loader import resolve_model_path

    path = resolve_model_path(model_args["model"])
    return {**model_args, "model": str(path), "quiet": True}
