"""The Kubernetes manifests under deploy/ agree with the server they deploy: ports, probe paths,
``SPECDEC_*`` variable names and values, the cache path, the drain time and the autoscaling metric
are checked against the server's own definitions, not against copies of them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from server.cli import GRACE_ENV, _subparser, build_parser, env_name
from server.prometheus import ServerMetrics
from server.routes import routes
from specdec_core.kernels.cache_paths import CACHE_DIR_ENV
from tests.helpers.servers import FakeEngine

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "specdec.yaml"


@pytest.fixture(scope="module")
def docs() -> dict[str, dict]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(MANIFEST.read_text())}


def container(docs: dict[str, dict]) -> dict:
    (c,) = docs["Deployment"]["spec"]["template"]["spec"]["containers"]
    return c


def env(docs: dict[str, dict]) -> dict[str, dict]:
    return {e["name"]: e for e in container(docs)["env"]}


def test_every_variable_is_one_the_server_reads(docs) -> None:
    serve = _subparser(build_parser(), "serve")
    known = {env_name(a.dest) for a in serve._actions if a.option_strings and a.dest != "help"}
    known |= {GRACE_ENV, CACHE_DIR_ENV}
    assert set(env(docs)) <= known, set(env(docs)) - known
    # and each value parses as its flag would
    for name, entry in env(docs).items():
        action = next((a for a in serve._actions if a.option_strings and env_name(a.dest) == name), None)
        if action is not None and "value" in entry and action.type is not None:
            action.type(entry["value"])


def test_ports_line_up(docs) -> None:
    c = container(docs)
    (port,) = c["ports"]
    assert int(env(docs)["SPECDEC_PORT"]["value"]) == port["containerPort"]
    assert docs["Service"]["spec"]["ports"][0]["targetPort"] == port["name"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["port"] == port["name"]
    annotations = docs["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == port["containerPort"]


def test_probes_and_scrapes_hit_real_routes(docs) -> None:
    paths = {r.path for r in routes()}
    c = container(docs)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == "/health" and "/health" in paths
    assert docs["Deployment"]["spec"]["template"]["metadata"]["annotations"]["prometheus.io/path"] in paths
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 20 * 60  # a first weight conversion
    live = c["livenessProbe"]
    grace = float(env(docs)[GRACE_ENV]["value"])
    assert live["periodSeconds"] * live["failureThreshold"] > grace  # a drain is not a death


def test_the_drain_fits_the_termination_grace(docs) -> None:
    grace = float(env(docs)[GRACE_ENV]["value"])
    assert docs["Deployment"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > grace + 5


def test_the_cache_volume_is_where_the_server_caches(docs) -> None:
    (mount,) = container(docs)["volumeMounts"]
    assert env(docs)[CACHE_DIR_ENV]["value"] == mount["mountPath"]
    volumes = {v["name"]: v for v in docs["Deployment"]["spec"]["template"]["spec"]["volumes"]}
    assert volumes[mount["name"]]["persistentVolumeClaim"]["claimName"] == docs["PersistentVolumeClaim"]["metadata"]["name"]


def test_the_autoscaling_metric_is_one_the_server_exports(docs) -> None:
    (metric,) = docs["HorizontalPodAutoscaler"]["spec"]["metrics"]
    name = metric["pods"]["metric"]["name"]
    engine = FakeEngine(tokenizer=[])  # no requests: the metrics need no tokenizer
    text = ServerMetrics(lambda: engine, lambda: "m").render().decode()
    assert any(line.split("{")[0] == name for line in text.splitlines() if not line.startswith("#")), name
    assert docs["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]["name"] == docs["Deployment"]["metadata"]["name"]
