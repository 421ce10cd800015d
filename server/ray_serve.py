"""``specdec serve-ray``: the same server, one replica per device, behind Ray Serve's HTTP proxy.

A replica is ``specdec serve`` without its process runner: the same Starlette app (``build_app``)
with the same routes, error objects, SSE streams, ``speculative`` report, ``/health`` and
``/metrics``, mounted as a Ray Serve ASGI ingress. Ray Serve adds what one process cannot:
replicas across a cluster, one HTTP endpoint in front of them, autoscaling on ongoing requests,
and restarting a replica whose process died.

Only this module imports ray (the ``ray`` extra); ``specdec serve`` never does.

Sizing: a replica owns one device, a GPU (``num_gpus=1``) where there is one, otherwise a share of
the CPU cores (its torch threads). A replica is routed requests once its model is loaded (its
constructor loads it), so a new replica never answers 503 while loading. The autoscaling target
is ``--max-num-seqs`` ongoing requests per replica: a replica whose batch is full has reached it,
and requests beyond it would only queue.
"""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import dataclass
from typing import Any

import structlog

from server.settings import ServerSettings

log = structlog.get_logger("specdec.server")

DEPLOYMENT = "specdec"
APPLICATION = "specdec"
# Which replica answered (Ray Serve's replica id): for logs, load-balancing checks and debugging.
REPLICA_HEADER = "x-specdec-replica"


@dataclass
class RayScaling:
    """How many replicas, and what each one gets. ``num_replicas`` fixes the count; otherwise the
    deployment autoscales between ``min_replicas`` and ``max_replicas``."""

    num_replicas: int | None = None
    min_replicas: int = 1
    max_replicas: int = 1
    target_ongoing_requests: float | None = None  # default: the engine's max_num_seqs
    cpus_per_replica: float | None = None  # default: this machine's cores / replicas (CPU replicas)
    gpus_per_replica: float | None = None  # default: 1 where CUDA is available, else 0
    address: str | None = None  # a running Ray cluster ("auto", "ray://host:10001"); None: start one here


def deployment_options(settings: ServerSettings, scaling: RayScaling, cuda_available: bool, cpu_count: int) -> dict[str, Any]:
    """Ray Serve options of the deployment (pure: tested without Ray)."""
    cfg = settings.engine
    gpus = scaling.gpus_per_replica
    if gpus is None:
        gpus = 1.0 if cfg.device == "cuda" or (cfg.device == "auto" and cuda_available) else 0.0
    most = scaling.num_replicas or scaling.max_replicas
    cpus = scaling.cpus_per_replica
    if cpus is None:
        cpus = 1.0 if gpus else float(max(1, cpu_count // max(1, most)))
    options: dict[str, Any] = {
        "ray_actor_options": {"num_cpus": cpus, "num_gpus": gpus},
        # A replica takes its running batch plus its own queue; beyond that its 429s say "full".
        "max_ongoing_requests": cfg.max_num_seqs + (settings.max_queue if settings.max_queue is not None else 1024),
        "graceful_shutdown_timeout_s": settings.shutdown_grace_s,
        "health_check_period_s": 5.0,
    }
    if scaling.num_replicas is not None:
        options["num_replicas"] = scaling.num_replicas
    else:
        options["autoscaling_config"] = {
            "min_replicas": scaling.min_replicas,
            "max_replicas": scaling.max_replicas,
            "target_ongoing_requests": scaling.target_ongoing_requests or float(cfg.max_num_seqs),
        }
    return options


class ReplicaHeader:
    """ASGI wrapper that names the replica in every HTTP response (lifespan passes through)."""

    def __init__(self, app: Any, replica: str) -> None:
        self.app = app
        self.header = (REPLICA_HEADER.encode(), replica.encode())

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_named(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, send_named)


def build_application(settings: ServerSettings, scaling: RayScaling) -> Any:
    """The Ray Serve application (bound deployment) of ``settings``."""
    import torch
    from ray import serve

    from server.app import build_app
    from server.services.engine_host import load_engine
    from server.state import Phase

    options = deployment_options(settings, scaling, torch.cuda.is_available(), os.cpu_count() or 1)
    threads = max(1, int(options["ray_actor_options"]["num_cpus"]))

    @serve.deployment(name=DEPLOYMENT, **options)
    @serve.ingress()
    class SpecdecReplica:
        async def __init__(self, settings: ServerSettings) -> None:  # type: ignore[misc]  # Ray Serve awaits it
            from server.logging_setup import configure_logging

            configure_logging(settings.log_level)
            torch.set_num_threads(threads)  # this replica's share of the cores
            self.settings = settings
            # Loaded before the replica counts as started: Ray routes nothing to it until then.
            self.engine = await asyncio.to_thread(load_engine, settings.engine)
            self.replica = serve.get_replica_context().replica_id.unique_id
            self.server_app: Any = None  # ('app' is Ray's own attribute)
            log.info("replica ready", replica=self.replica, pid=os.getpid())

        def __serve_build_asgi_app__(self) -> Any:
            self.server_app = build_app(self.settings, engine_factory=lambda _config: self.engine)
            return ReplicaHeader(self.server_app, self.replica)

        async def check_health(self) -> None:
            """Ray restarts a replica whose engine died (the same condition /health reports)."""
            state = self.server_app.state.server if self.server_app is not None else None
            if state is not None and state.phase is Phase.READY and not self.engine.is_healthy:
                raise RuntimeError(f"engine loop stopped: {self.engine.dead_reason}")

    return SpecdecReplica.bind(settings)  # type: ignore[attr-defined]  # added by @serve.deployment


def serve_ray(settings: ServerSettings, scaling: RayScaling) -> int:
    """Start (or join) a Ray cluster, serve the application at ``settings.host:port``, and block
    until interrupted; then shut the application down."""
    import ray
    from ray import serve

    from server.logging_setup import configure_logging

    configure_logging(settings.log_level)
    ray.init(address=scaling.address, ignore_reinit_error=True)
    serve.start(http_options={"host": settings.host, "port": settings.port})
    # SIGTERM: shut the application down, then exit 0 (set after ray.init, which installs its own).
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        serve.run(build_application(settings, scaling), name=APPLICATION, route_prefix="/", blocking=True)
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()
    return 0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
