"""The variant registry: ``get(name)`` and ``list()``.

Each module defines its variants' mathematics once (reference, arithmetic-generic) next to the torch
implementation; see ``Variant`` for the calling conventions.
"""

from __future__ import annotations

import builtins

from . import deltanet, gla, linear, performer, qknorm, retnet, softmax, transnormer
from .spec import TAGS, Variant

_REGISTRY: dict[str, Variant] = {}
for _module in (softmax, linear, performer, qknorm, transnormer, gla, retnet, deltanet):
    for _v in _module.VARIANTS:
        _REGISTRY[_v.name] = _v


def get(name: str | Variant) -> Variant:
    """The registered variant ``name`` (a Variant passes through); ValueError naming the argument."""
    if isinstance(name, Variant):
        return name
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"variant: got {name!r}; expected one of {', '.join(sorted(_REGISTRY))}") from None


def list() -> builtins.list[Variant]:  # noqa: A001 - the registry's public name
    """All registered variants, sorted by name."""
    return [_REGISTRY[n] for n in sorted(_REGISTRY)]


def names() -> builtins.list[str]:
    return sorted(_REGISTRY)


__all__ = ["TAGS", "Variant", "get", "list", "names"]
