"""specdec_core: a batched, lossless speculative decoding engine with continuous batching.

Public API: ``EngineConfig``, ``SamplingParams``, ``Engine`` (synchronous, one ``step()`` at a
time), ``AsyncEngine`` (thread-backed, ``async for`` over ``RequestOutput`` deltas).

The names are imported lazily (PEP 562): ``import specdec_core.config`` must not pull in torch,
so that ``specdec serve --help`` and the CLI's flag generation stay instant.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "AsyncEngine": "async_engine",
    "EngineDeadError": "async_engine",
    "RequestStream": "async_engine",
    "EngineConfig": "config",
    "Completion": "engine",
    "Engine": "engine",
    "EngineMetrics": "metrics",
    "RequestOutput": "outputs",
    "RequestStats": "outputs",
    "TokenLogprob": "outputs",
    "SamplingParams": "sampling_params",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from .async_engine import AsyncEngine, EngineDeadError, RequestStream
    from .config import EngineConfig
    from .engine import Completion, Engine
    from .metrics import EngineMetrics
    from .outputs import RequestOutput, RequestStats, TokenLogprob
    from .sampling_params import SamplingParams


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'specdec_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value
