"""specdec_core: a batched, lossless speculative decoding engine with continuous batching.

Public API: ``EngineConfig``, ``SamplingParams``, ``Engine`` (synchronous, one ``step()`` at a
time), ``AsyncEngine`` (thread-backed, ``async for`` over ``RequestOutput`` deltas).

The names are imported lazily (PEP 562): ``import specdec_core.engine.config`` must not pull in torch,
so that ``specdec serve --help`` and the CLI's flag generation stay instant.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "AsyncEngine": "engine.async_engine",
    "EngineDeadError": "engine.async_engine",
    "RequestStream": "engine.async_engine",
    "EngineConfig": "engine.config",
    "Completion": "engine.engine",
    "Engine": "engine.engine",
    "EngineMetrics": "engine.stats",
    "RequestOutput": "engine.outputs",
    "RequestStats": "engine.outputs",
    "TokenLogprob": "decoding.token_logprob",
    "SamplingParams": "decoding.sampling_params",
}

__all__ = [
    "AsyncEngine", "Completion", "Engine", "EngineConfig", "EngineDeadError", "EngineMetrics", "RequestOutput",
    "RequestStats", "RequestStream", "SamplingParams", "TokenLogprob",
]
assert sorted(__all__) == sorted(_EXPORTS)

if TYPE_CHECKING:
    from specdec_core.decoding.sampling_params import SamplingParams
    from specdec_core.decoding.token_logprob import TokenLogprob
    from specdec_core.engine.async_engine import AsyncEngine, EngineDeadError, RequestStream
    from specdec_core.engine.config import EngineConfig
    from specdec_core.engine.engine import Completion, Engine
    from specdec_core.engine.outputs import RequestOutput, RequestStats
    from specdec_core.engine.stats import EngineMetrics


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'specdec_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value
