"""Cache-aware routing over engine instances (``pace serve --instances N``).

Each instance has its own KV pool, so a prompt whose prefix one instance already computed is
cheaper there. :class:`PrefixRouter` remembers, per instance, the block keys of the prompts
routed to it (a bounded least-recently-used set; the instance's own LRU may have evicted some
since, so this is an estimate, as in SGLang's router) and prefers the instance holding the
longest prefix of a new prompt, unless it has more than ``slack`` sequences in flight beyond
the least-loaded instance; otherwise the least-loaded instance wins.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Hashable, Sequence

from pace_core.caches.block_pool import BlockKey, block_keys

__all__ = ["PrefixRouter"]

ROUTING_BLOCK_TOKENS = 64  # the paged cache's default block


class PrefixRouter:
    """Longest-remembered-prefix routing with a load bound.

    Instances are any hashable keys (indices of ``--instances``, Ray Serve replica ids).

    Args:
        slack: how many more sequences in flight than the least-loaded instance the prefix
            holder may have and still be chosen.
        capacity: block keys remembered per instance.
    """

    def __init__(self, slack: int, capacity: int = 1 << 16) -> None:
        self.slack = slack
        self.capacity = capacity
        self.seen: collections.defaultdict[Hashable, collections.OrderedDict[BlockKey, None]]
        self.seen = collections.defaultdict(collections.OrderedDict)

    def keys(self, prompt: Sequence[int], salt: str) -> list[BlockKey]:
        """The routing keys of ``prompt``'s full blocks."""
        return block_keys(prompt, ROUTING_BLOCK_TOKENS, salt.encode())

    def held(self, instance: Hashable, keys: Sequence[BlockKey]) -> int:
        """Leading ``keys`` remembered for ``instance``."""
        seen, n = self.seen.get(instance, {}), 0
        for key in keys:
            if key not in seen:
                break
            n += 1
        return n

    def choose(
        self,
        prompt: Sequence[int],
        salt: str,
        candidates: Sequence[Hashable],
        load: Callable[[Hashable], int],
    ) -> Hashable:
        """The instance for ``prompt`` among ``candidates`` (non-empty)."""
        order = {c: n for n, c in enumerate(candidates)}
        least = min(candidates, key=lambda i: (load(i), order[i]))
        keys = self.keys(prompt, salt)
        if not keys or len(candidates) == 1:
            return least
        best = max(candidates, key=lambda i: (self.held(i, keys), -load(i), -order[i]))
        if self.held(best, keys) and load(best) <= load(least) + self.slack:
            return best
        return least

    def record(self, instance: Hashable, prompt: Sequence[int], salt: str) -> None:
        """``prompt``'s blocks are (about to be) cached on ``instance``."""
        seen = self.seen[instance]
        for key in self.keys(prompt, salt):
            seen[key] = None
            seen.move_to_end(key)
        while len(seen) > self.capacity:
            seen.popitem(last=False)

    def forget(self, instance: Hashable) -> None:
        """``instance`` restarted with an empty cache (or is gone)."""
        self.seen.pop(instance, None)
