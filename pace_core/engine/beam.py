"""Beam search with the semantics of transformers 5.23's ``GenerationMixin._beam_search``.

What is matched (see ``transformers/generation/utils.py``):

* Scores are accumulated log-probabilities: ``log_softmax`` of the raw logits, *then* the
  logits processors (repetition penalty, min_new_tokens, logit_bias, ...) run on those
  log-probs, then the running beam score is added. Before the first step only beam 0 is live
  (the others start at ``-1e9``), so the identical prompt copies do not yield duplicate beams.
* Each step keeps the top ``K = max(2, 1 + n_eos) * num_beams`` candidates over
  ``num_beams * V``. Candidates that end with an EOS id (or reach ``max_new_tokens``) leave the
  running set (their running score gets ``-1e9``); the best ``num_beams`` others continue.
* Only finished candidates among the top ``num_beams`` of the ``K`` may become hypotheses; a
  hypothesis scores ``sum_logprobs / n_generated ** length_penalty`` where ``n_generated``
  counts the generated tokens only (EOS included, prompt excluded). The best ``num_beams``
  hypotheses are kept per prompt.
* ``early_stopping=True``: a prompt is done once it holds ``num_beams`` hypotheses.
  ``False``: done when the best running score divided by ``n_generated_so_far **
  length_penalty`` cannot beat the worst kept hypothesis. ``"never"``: the same, but with
  ``max_new_tokens ** length_penalty`` when ``length_penalty > 0``. At ``max_new_tokens`` the
  top running candidates become hypotheses. Returned: the best ``num_return_sequences``
  hypotheses, best first, token ids incl. a final EOS, score as above (HF's
  ``sequences_scores``).

Each prompt is prefilled once and its cache sequence forked into the beams; every step the
cache is reordered with ``cache.retain`` (beams that won twice are forked, the rest freed). A
prompt that is done leaves the batch (its sequences are freed); this does not change any
result because HF never updates a done prompt again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from pace_core.engine.offline import pack_tokens
from pace_core.engine.output import GenerationOutput, SequenceOutput
from pace_core.errors import ConfigError
from pace_core.models.decoder import DecoderLM, forward_step, prefill
from pace_core.sampling.config import SamplingConfig
from pace_core.sampling.processors import LogitsProcessor, build_processors
from pace_core.sampling.sampler import check_token_ids
from pace_core.sampling.state import TokenState

__all__ = ["BeamHypothesis", "beam_search"]

_NEG = -1.0e9  # HF's "very large negative" score


@dataclass
class BeamHypothesis:
    """One finished beam: the generated ``token_ids`` (no prompt) and its length-penalised score."""

    token_ids: list[int]
    score: float


def _gather(t: Tensor, idx: Tensor) -> Tensor:
    """``t [P, N, ...]`` gathered along dim 1 with ``idx [P, M]`` (HF's ``_gather_beams``)."""
    while idx.dim() < t.dim():
        idx = idx.unsqueeze(-1)
    return torch.take_along_dim(t, idx, dim=1)


# SamplingConfig fields beam search does not apply (set, they are refused, never ignored)
BEAM_UNSUPPORTED = ("stop", "logprobs", "prompt_logprobs", "json_schema", "grammar")


@torch.inference_mode()
def beam_search(
    model: DecoderLM,
    new_cache: Callable[[], Any],
    prompts: Sequence[Tensor],
    config: SamplingConfig,
    eos_token_ids: Sequence[int],
    processors: Iterable[Any] | None = None,
    num_return_sequences: int = 1,
    *,
    early_stopping: bool | str | None = None,
) -> list[list[BeamHypothesis]]:
    """Beam search over a batch of 1-D prompts; per prompt, the best hypotheses, best first.

    Args:
        model: the decoder.
        new_cache: returns an empty KV cache (e.g. ``LLMModel.new_cache``).
        prompts: unpadded 1-D token id tensors (batched with left padding).
        config: ``num_beams``, ``max_new_tokens``, ``min_new_tokens``, ``length_penalty``,
            ``early_stopping``, penalties / ``logit_bias`` (greedy only: ``do_sample`` raises).
        eos_token_ids: the model's EOS ids, used when ``config.eos_token_id`` is None.
        processors: logits processor specs for :func:`build_processors` (default built-ins).
        num_return_sequences: hypotheses returned per prompt (``1..num_beams``).
        early_stopping: overrides ``config.early_stopping``; also accepts HF's ``"never"``.
    """
    nb = config.num_beams
    if config.do_sample:
        raise ValueError("beam search is greedy only: do_sample=True is not supported")
    if not 1 <= num_return_sequences <= nb:
        raise ValueError(
            f"num_return_sequences must be in [1, num_beams={nb}] (got {num_return_sequences})"
        )
    es = config.early_stopping if early_stopping is None else early_stopping
    if es not in (True, False, "never"):
        raise ValueError(f"early_stopping must be True, False or 'never' (got {es!r})")
    if any(p.numel() == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    ignored = [name for name in BEAM_UNSUPPORTED if getattr(config, name) is not None]
    if ignored:
        raise ConfigError(f"beam search does not support {', '.join(ignored)}: drop them or "
                          "use num_beams=1")  # fmt: skip
    check_token_ids(config, model.vocab_size)
    if not prompts:
        return []
    eos = tuple(config.eos_token_ids or tuple(int(e) for e in eos_token_ids))
    cfg = config
    if config.eos_token_id is None and eos:  # min_new_tokens masks the resolved EOS
        cfg = config.merged(eos_token_id=list(eos))
    stop_ids = torch.tensor(() if config.ignore_eos else eos, dtype=torch.long)
    max_new, lp_pen = config.max_new_tokens, float(config.length_penalty)
    k = max(2, 1 + stop_ids.numel()) * nb
    top_mask = torch.arange(k) < nb
    specs = list(processors) if processors is not None else None
    built: dict[int, list[tuple[str, LogitsProcessor]]] = {}

    # Prefill each prompt once, then fork its cache sequence into its num_beams beams.
    b = len(prompts)
    cache = new_cache()
    seq_ids = cache.add_sequences(b)
    logits = prefill(model, cache, seq_ids, prompts)
    seq_ids = cache.retain([s for s in seq_ids for _ in range(nb)])
    expand = torch.arange(b).repeat_interleave(nb)
    logits = logits.index_select(0, expand)
    state = TokenState([prompts[i] for i in expand.tolist()], logits.shape[-1])

    alive = list(range(b))
    run_seq = torch.zeros(b, nb, max_new, dtype=torch.long)
    run_scores = torch.zeros(b, nb)
    run_scores[:, 1:] = _NEG
    fin_seq = torch.zeros(b, nb, max_new, dtype=torch.long)
    fin_scores = torch.full((b, nb), _NEG)
    fin_len = torch.zeros(b, nb, dtype=torch.long)
    is_fin = torch.zeros(b, nb, dtype=torch.bool)
    heur = torch.ones(b, 1, dtype=torch.bool)  # HF: is_early_stop_heuristic_unsatisfied
    results: list[list[BeamHypothesis]] = [[] for _ in range(b)]

    for step in range(max_new):
        p, rows = len(alive), len(alive) * nb
        if rows not in built:
            built[rows] = build_processors([cfg] * rows, specs)
        scores = torch.log_softmax(logits.float(), dim=-1)
        for _, proc in built[rows]:
            scores = proc(scores, state)
        v = scores.shape[-1]
        acc = (scores.view(p, nb, v) + run_scores[:, :, None]).view(p, nb * v)

        # Top-K continuations over all beams of each prompt.
        topk_lp, topk_idx = torch.topk(acc, k)
        src, tok = topk_idx // v, topk_idx % v
        cand = _gather(run_seq, src)
        cand[:, :, step] = tok
        hits = torch.isin(tok, stop_ids)
        if step + 1 >= max_new:
            hits = torch.ones_like(hits)

        # Running beams for the next step: the best num_beams unfinished candidates.
        run_lp = topk_lp + hits.to(torch.float32) * _NEG
        nxt = torch.topk(run_lp, k=nb)[1]
        run_seq, run_scores, run_src = _gather(cand, nxt), _gather(run_lp, nxt), _gather(src, nxt)

        # Finished hypotheses: merge the new ones in and keep the best num_beams.
        just = hits & top_mask[None, :]
        fl = topk_lp / ((step + 1) ** lp_pen)
        fl += (is_fin.all(dim=-1, keepdim=True) & (es is True)).to(torch.float32) * _NEG
        fl += (~heur).to(torch.float32) * _NEG
        fl += (~just) * _NEG
        merged = torch.cat((fin_scores, fl), dim=1)
        best = torch.topk(merged, k=nb)[1]
        fin_seq = _gather(torch.cat((fin_seq, cand), dim=1), best)
        fin_scores = _gather(merged, best)
        fin_len = _gather(torch.cat((fin_len, torch.full_like(tok, step + 1)), dim=1), best)
        is_fin = _gather(torch.cat((is_fin, just), dim=1), best)

        # Can the running beams still improve on the kept hypotheses?
        n_gen = step + 1
        hyp_len = max_new if es == "never" and lp_pen > 0.0 else n_gen
        best_running = run_scores[:, :1] / (hyp_len**lp_pen)
        worst = torch.where(is_fin, fin_scores.min(dim=1, keepdim=True)[0], _NEG)
        heur = heur & torch.any(best_running > worst, dim=-1, keepdim=True)
        done = ~heur[:, 0] | (is_fin.all(dim=-1) & (es is True)) | hits.all(dim=-1)

        for i in done.nonzero().view(-1).tolist():
            results[alive[i]] = [
                BeamHypothesis(
                    fin_seq[i, j, : int(fin_len[i, j])].tolist(), float(fin_scores[i, j])
                )
                for j in range(num_return_sequences)
            ]
        keep = (~done).nonzero().view(-1)
        if keep.numel() == 0:
            break
        if keep.numel() < p:
            alive = [alive[i] for i in keep.tolist()]
            run_seq, run_scores, run_src = run_seq[keep], run_scores[keep], run_src[keep]
            fin_seq, fin_scores, fin_len = fin_seq[keep], fin_scores[keep], fin_len[keep]
            is_fin, heur = is_fin[keep], heur[keep]
        # Reorder (fork / free) cache sequences and histories to the selected source beams.
        flat = (keep[:, None] * nb + run_src).view(-1)
        seq_ids = cache.retain([seq_ids[r] for r in flat.tolist()])
        if not torch.equal(flat, torch.arange(rows)):
            state = state.select(flat)
        next_ids = run_seq[:, :, step].reshape(-1)
        state.append(next_ids)
        reprefill = model.reprefill_at
        if reprefill is not None and any(cache.get_num_tokens(s) == reprefill for s in seq_ids):
            # LongRoPE crossing: recompute all keys with the long factors (as the engine core).
            for s in seq_ids:
                cache.crop(s, cache.get_num_tokens(s))
            histories = [
                torch.cat([prompts[alive[r // nb]], run_seq[r // nb, r % nb, : step + 1]])
                for r in range(len(seq_ids))
            ]
            logits = prefill(model, cache, seq_ids, histories)
        else:
            logits = forward_step(model, cache, seq_ids, next_ids.view(-1, 1), [1] * len(seq_ids))
    cache.retain([])
    return results


def beam_output(
    prompts: Sequence[Tensor],
    padded: Tensor | None,
    best: Sequence[BeamHypothesis],
    eos: set[int],
    tokenizer: Any | None,
    pad: int,
) -> GenerationOutput:
    """``generate``'s result of a beam search: each prompt's best hypothesis, its text, and
    "stop" when it ended with an EOS id."""
    sequences = [
        SequenceOutput(
            p.tolist(),
            h.token_ids,
            None if tokenizer is None else tokenizer.decode(h.token_ids, skip_special_tokens=True),
            "stop" if h.token_ids and h.token_ids[-1] in eos else "length",
        )
        for p, h in zip(prompts, best)
    ]
    tokens = pack_tokens(prompts, padded, [h.token_ids for h in best], pad)
    return GenerationOutput(tokens, sequences)
