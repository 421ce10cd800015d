"""The Starlette application: routes, middleware, error handlers, and the engine's lifespan.

The engine loads in a background thread *after* the HTTP server starts, so ``/health`` answers
503 (and generation 503 with Retry-After) while weights load, instead of the port staying closed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import structlog
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware

from server.http.auth import APIKeyMiddleware
from server.http.errors import APIError, handle_api_error, handle_http_exception, handle_unexpected
from server.http.host_check import RequestTargetMiddleware
from server.http.request_log import RequestLogMiddleware
from server.routes import routes
from server.services.engine_host import EngineFactory, EngineHost, load_engine
from server.settings import ServerSettings
from server.state import Phase, ServerState
from specdec_core.engine.model_files import ModelFileError

log = structlog.get_logger("specdec.server")
# The exit status of a server whose model file is malformed (``specdec serve`` exits with it before
# its port opens when the header is what is wrong: ``server.cli``)
MODEL_FILE_EXIT = 2
# Response headers a cross-origin page may read besides the CORS-safelisted ones.
CORS_EXPOSED_HEADERS = ["x-request-id", "retry-after"]

def build_app(
    settings: ServerSettings,
    *,
    engine_factory: EngineFactory | None = None,
    on_fatal: Callable[[int], None] | None = None,
) -> Starlette:
    """Build the app. ``engine_factory`` defaults to the real engine; ``on_fatal(exit_code)`` is
    called when the engine cannot be built (the process runner then exits non-zero)."""
    state = ServerState(settings)
    host = EngineHost(engine_factory or load_engine, settings.engine)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        loader = asyncio.create_task(_load_engine(state, host, on_fatal), name="specdec-engine-load")
        try:
            yield
        finally:
            state.phase = Phase.STOPPED
            loader.cancel()
            await asyncio.gather(loader, return_exceptions=True)
            await host.stop()
            state.close()

    # Outermost first: the request log sees every answer, the Host check runs before anything else
    # (a rebound DNS name gets its 400 even on a preflight), CORS answers preflights before the key
    # check (browsers never send credentials on a preflight; vLLM does the same) and adds its headers
    # to every answer below it, 401s included, so a page can read why it was refused.
    middleware = [
        Middleware(RequestLogMiddleware, metrics=state.metrics),
        Middleware(RequestTargetMiddleware, allowed_hosts=settings.host_allowlist),
    ]
    cors = settings.cors
    if cors is not None:
        middleware.append(Middleware(
            CORSMiddleware, allow_origins=cors["allow_origins"], allow_methods=cors["allow_methods"],
            allow_headers=cors["allow_headers"], expose_headers=CORS_EXPOSED_HEADERS))
    if settings.api_key:
        middleware.append(Middleware(APIKeyMiddleware, api_key=settings.api_key))
    app = Starlette(
        routes=routes(),
        middleware=middleware,
        exception_handlers={
            APIError: handle_api_error,
            HTTPException: handle_http_exception,
            Exception: handle_unexpected,
        },
        lifespan=lifespan,
        # No max_body_size: Starlette's 413 is plain text; server.http.body enforces the limit instead.
    )
    # Trailing slashes are stripped before routing (server.http.host_check); Starlette's redirect
    # would build its Location from the client's Host header.
    app.router.redirect_slashes = False
    app.state.server = state
    app.state.engine_host = host
    return app


async def _load_engine(state: ServerState, host: EngineHost, on_fatal: Callable[[int], None] | None) -> None:
    cfg = state.settings.engine
    log.info(
        "loading engine",
        model=cfg.model or "default pair",
        draft_model=cfg.draft_model,
        speculative_method=cfg.speculative_method or "auto",
        device=cfg.device,
    )
    try:
        engine = await host.start()
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        state.phase = Phase.FAILED
        state.load_error = f"{type(exc).__name__}: {exc}"
        malformed = isinstance(exc, ModelFileError)
        if malformed:  # the user's file, not our fault: one line (it names the field), exit 2
            log.error("engine failed to load: the model file is malformed", error=str(exc))
        else:
            log.exception("engine failed to load")
        if on_fatal is not None:
            on_fatal(MODEL_FILE_EXIT if malformed else 1)
        return
    if state.phase is not Phase.LOADING:  # shutdown began while loading; lifespan exit stops it
        return
    if state.settings.chat_template_text is not None:  # before the first chat request can render
        had_own = bool(getattr(engine.tokenizer, "chat_template", None))
        engine.tokenizer.chat_template = state.settings.chat_template_text
        log.info("chat template: from --chat-template", replaced_the_models_own=had_own)
    state.engine = engine
    state.phase = Phase.READY
    log.info(
        f"ready: serving {state.served_model_name} at {state.settings.url}/v1",
        url=f"{state.settings.url}/v1",
        model=state.served_model_name,
        speculative_method=engine.speculative_method,
        num_speculative_tokens=engine.num_speculative_tokens,
        max_model_len=engine.max_model_len,
    )
