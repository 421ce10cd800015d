"""specdec_core: a batched, lossless speculative decoding engine with continuous batching.

Public API: ``EngineConfig``, ``SamplingParams``, ``Engine`` (synchronous, one ``step()`` at a
time), ``AsyncEngine`` (thread-backed, ``async for`` over ``RequestOutput`` deltas).
"""

from .async_engine import AsyncEngine, EngineDeadError, RequestStream
from .config import EngineConfig
from .engine import Completion, Engine
from .metrics import EngineMetrics
from .outputs import RequestOutput, RequestStats, TokenLogprob
from .sampling_params import SamplingParams

__all__ = [
    "AsyncEngine",
    "Completion",
    "Engine",
    "EngineConfig",
    "EngineDeadError",
    "EngineMetrics",
    "RequestOutput",
    "RequestStats",
    "RequestStream",
    "SamplingParams",
    "TokenLogprob",
]
