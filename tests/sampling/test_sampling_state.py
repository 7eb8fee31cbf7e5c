"""TokenState: sparse views, lazy dense views, append/select/concat, builtin registration."""

from __future__ import annotations

import pytest
import torch

from pace_core.sampling import BUILTIN_PROCESSORS, TokenState, register_builtin_processors

V = 10


def dense_reference(prompts, generated, v=V):
    seen = torch.zeros(len(prompts), v, dtype=torch.bool)
    counts = torch.zeros(len(prompts), v, dtype=torch.int32)
    for i, (p, g) in enumerate(zip(prompts, generated, strict=True)):
        for t in p:
            if t < v:
                seen[i, t] = True
        for t in g:
            seen[i, t] = True
            counts[i, t] += 1
    return seen, counts


def check(state: TokenState, prompts, generated):
    seen, counts = dense_reference(prompts, generated)
    assert torch.equal(state.seen_mask(), seen)
    assert torch.equal(state.output_counts(), counts)
    ids, cnt, valid = state.output_token_counts()
    for i, g in enumerate(generated):
        assert state.generated(i).tolist() == g
        assert ids[i][valid[i]].tolist() == g
        assert cnt[i][valid[i]].tolist() == [g.count(t) for t in g]
    s_ids, s_valid = state.seen_ids()
    for i, (p, g) in enumerate(zip(prompts, generated, strict=True)):
        assert sorted(s_ids[i][s_valid[i]].tolist()) == sorted([t for t in p if t < V] + g)


def test_append_select_concat_match_reference():
    prompts = [[1, 2, 2], [], [3, 12]]  # empty prompt; 12 >= V is ignored
    state = TokenState(prompts, V)
    gen = [[], [], []]
    g = torch.Generator().manual_seed(0)
    for step in range(20):  # > initial capacity of 16
        toks = torch.randint(0, V, (3,), generator=g)
        state.append(toks)
        for i, t in enumerate(toks.tolist()):
            gen[i].append(t)
        if step == 3:
            check(state, prompts, gen)  # dense views built here, then kept incrementally
    check(state, prompts, gen)

    sel = state.select(torch.tensor([2, 0]))
    check(sel, [prompts[2], prompts[0]], [gen[2], gen[0]])
    other = TokenState([[4, 4]], V)
    other.append(torch.tensor([5]))
    both = sel.concat(other)  # other has no dense views yet: built exactly on concat
    check(both, [prompts[2], prompts[0], [4, 4]], [gen[2], gen[0], [5]])
    assert both.num_generated.tolist() == [20, 20, 1]
    both.append(torch.tensor([5, 5, 5]))
    check(both, [prompts[2], prompts[0], [4, 4]], [[*gen[2], 5], [*gen[0], 5], [5, 5]])


def test_sparse_only_state_never_builds_dense():
    state = TokenState([[1], [2]], V)
    for t in range(5):
        state.append(torch.tensor([t, t]))
    state = state.select(torch.tensor([True, False])).concat(TokenState([[3]], V))
    assert state._seen is None and state._counts is None
    assert state._entry_counts is None  # per-entry counts too: built when first asked for
    check(state, [[1], [3]], [[0, 1, 2, 3, 4], []])


def test_errors():
    with pytest.raises(ValueError, match="vocab_size"):
        TokenState([[1]], 0)
    with pytest.raises(ValueError, match=">= 0"):
        TokenState([[-1]], V)
    state = TokenState([[1]], V)
    with pytest.raises(ValueError, match="append expects 1 tokens"):
        state.append(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="vocab_size"):
        state.concat(TokenState([[1]], V + 1))
    with pytest.raises(ValueError, match="row mask"):
        state.select(torch.tensor([True, False]))


def test_register_builtin_processors():
    class FakeRegistry:
        def __init__(self):
            self.added = []

        def add_processor(self, name, factory, *, order):
            self.added.append((name, order, factory))

    reg = FakeRegistry()
    register_builtin_processors(reg)
    assert reg.added == BUILTIN_PROCESSORS
