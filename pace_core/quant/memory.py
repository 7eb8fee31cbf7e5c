"""What a built model keeps in memory: the bytes of every distinct tensor it references."""

from __future__ import annotations

from typing import Any

import torch


def reachable(root: Any, *, max_depth: int = 12) -> list[Any]:
    """Every object reachable from ``root`` through dataclass fields, ``__slots__``,
    ``__dict__``, lists, tuples, sets and dict values (tensors and scalars are leaves)."""
    seen: dict[int, Any] = {}

    def visit(obj: Any, depth: int) -> None:
        if depth > max_depth or id(obj) in seen:
            return
        seen[id(obj)] = obj
        leaf = str | bytes | int | float | bool | type | torch.dtype | torch.Tensor
        if isinstance(obj, leaf) or obj is None:
            return
        if isinstance(obj, dict):
            children = list(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset):
            children = list(obj)
        else:
            children = list(getattr(obj, "__dict__", {}).values())
            for cls in type(obj).__mro__:
                for name in getattr(cls, "__slots__", ()):
                    if hasattr(obj, name):
                        children.append(getattr(obj, name))
        for child in children:
            visit(child, depth + 1)

    visit(root, 0)
    return list(seen.values())


def weight_bytes(root: Any, *, max_depth: int = 12) -> int:
    """Bytes of the distinct tensor storages reachable from ``root`` (a built model).

    Walks dataclass fields, ``__slots__``, ``__dict__``, lists, tuples and dicts; a storage
    shared by two roles (a tied head, a view) counts once. Kernels' own packed copies count
    too, as they are held by the bound weights.
    """
    storages: dict[int, int] = {}
    for obj in reachable(root, max_depth=max_depth):
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())
