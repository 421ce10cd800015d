"""specdec's HTTP layer: an OpenAI-compatible asyncio server over ``specdec_core.AsyncEngine``.

The package only speaks HTTP: it validates OpenAI requests, turns them into ``SamplingParams``,
submits them to the engine, and renders the engine's deltas as OpenAI responses or SSE streams.
How tokens are drafted and verified is the engine's business; nothing here depends on it.

Importing this package is cheap (no torch); the engine is imported only when a server starts.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
