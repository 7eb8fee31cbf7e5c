"""What a built model keeps in memory: the bytes of every distinct tensor it references."""

from __future__ import annotations

from typing import Any

import torch


def weight_bytes(root: Any, *, max_depth: int = 12) -> int:
    """Bytes of the distinct tensor storages reachable from ``root`` (a built model).

    Walks dataclass fields, ``__slots__``, ``__dict__``, lists, tuples and dicts; a storage
    shared by two roles (a tied head, a view) counts once. Kernels' own packed copies count
    too, as they are held by the bound weights.
    """
    seen_objects: set[int] = set()
    storages: dict[int, int] = {}

    def visit(obj: Any, depth: int) -> None:
        if depth > max_depth or id(obj) in seen_objects:
            return
        seen_objects.add(id(obj))
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
            return
        if isinstance(obj, str | bytes | int | float | bool | type | torch.dtype) or obj is None:
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
    return sum(storages.values())
