"""What the chart tells Kubernetes agrees with what the server really does: its flags (parsed by
the real argparse parser), its routes and open paths, its API-key variable, its drain window,
and the metric names that the endpoint picker and the autoscalers read."""

from __future__ import annotations

import base64
import math
from importlib.metadata import entry_points
from typing import Any

import pytest
import yaml
from starlette.routing import Route

from pagedserve import cli_args
from pagedserve.openai_compat.app import OPEN_PATHS
from pagedserve.openai_compat.routes import ROUTES
from tests.deploy.chart import (
    CHART,
    TP_FLAG,
    VALUE_SETS,
    find,
    parse_server,
    render,
    render_set,
    route_model_names,
    scraped_metric_names,
    server_container,
)


def _routes() -> dict[str, set[str]]:
    return {r.path: set(r.methods or ()) for r in ROUTES if isinstance(r, Route)}


@pytest.mark.parametrize("value_set", list(VALUE_SETS))
def test_server_args_parse(value_set: str) -> None:
    """Every rendered flag is one the real parser accepts, and the configs build."""
    container = server_container(render_set(value_set))
    args = container["args"]
    assert container["command"] == ["pagedserve"]
    assert [ep.value for ep in entry_points(group="console_scripts", name="pagedserve")] == [
        "pagedserve.cli:main"
    ]
    parsed = cli_args.build_parser().parse_args(args)
    assert parsed.command == "serve"
    server, engine = cli_args.configs_from_args(parsed, {})
    assert server.host == "0.0.0.0"  # probes and the Service reach the pod IP
    if TP_FLAG in args:
        tp = int(args[args.index(TP_FLAG) + 1])
        assert parsed.tensor_parallel_size == engine.parallel.tensor_parallel_size == tp


def _values_names(value_files: list[str]) -> list[str]:
    """server.servedModelName as the values files give it (the last file that sets it wins)."""
    names: Any = None
    for name in value_files:
        server = (yaml.safe_load((CHART / "ci" / name).read_text()) or {}).get("server", {})
        names = server.get("servedModelName", names)
    return [names] if isinstance(names, str) else list(names or [])


def _check_names_and_model(args: list[str], names: list[str]) -> None:
    """The server answers to exactly these names, the first reported, and loads the MODEL the
    chart put first (none: the default model), whatever the number of names."""
    parsed = cli_args.build_parser().parse_args(args)
    server, engine = cli_args.configs_from_args(parsed, {})
    assert list(server.served_model_name) == names
    assert server.model_name == (names[0] if names else None)
    assert engine.model.model == ("" if args[1].startswith("--") else args[1])


@pytest.mark.parametrize("value_set", list(VALUE_SETS))
def test_server_reads_the_served_names_the_values_give(value_set: str) -> None:
    args = server_container(render_set(value_set))["args"]
    _check_names_and_model(args, _values_names(VALUE_SETS[value_set]))


@pytest.mark.parametrize("model", ["", "org/model"])
@pytest.mark.parametrize("names", [["a"], ["a", "b"], ["a", "b", "org/c"]])
def test_server_reads_listed_names_with_and_without_a_model(names: list[str], model: str) -> None:
    """With the default model (no MODEL), `--served-model-name a b org/c` alone would read the
    hub-id-like org/c as the MODEL: the chart's args must still mean every name and the
    default model."""
    sets = (f"server.servedModelName={{{','.join(names)}}}", f"model.name={model}")
    _check_names_and_model(server_container(render([], sets))["args"], names)


@pytest.mark.parametrize("value_set", list(VALUE_SETS))
def test_ports_probes_and_service_match_the_server(value_set: str) -> None:
    objects = render_set(value_set)
    container = server_container(objects)
    server = parse_server(container["args"])
    (port,) = container["ports"]
    assert port == {"name": "http", "containerPort": server.port, "protocol": "TCP"}
    routes = _routes()
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        http_get = container[probe]["httpGet"]
        assert http_get["port"] == "http"
        assert "GET" in routes[http_get["path"]]
        assert http_get["path"] in OPEN_PATHS  # probes send no API key
    service = find(objects, "Service", "model-server")
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    pod_labels = find(objects, "Deployment", "model-server")["spec"]["template"]["metadata"]
    assert service["spec"]["selector"].items() <= pod_labels["labels"].items()


@pytest.mark.parametrize("value_set", list(VALUE_SETS))
def test_termination_grace_outlasts_the_drain(value_set: str) -> None:
    """Kubernetes kills the container terminationGracePeriodSeconds after the preStop hook
    starts; the server needs the hook's sleep plus its own --graceful-timeout before that."""
    objects = render_set(value_set)
    pod = find(objects, "Deployment", "model-server")["spec"]["template"]["spec"]
    container = server_container(objects)
    server = parse_server(container["args"])
    hook = container["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[0] == "sleep"
    drain = int(hook[1]) + math.ceil(server.graceful_timeout)
    assert pod["terminationGracePeriodSeconds"] > drain, (value_set, drain)


@pytest.mark.parametrize("value_set", ["cpu", "gpu-tp2"])
def test_api_key_reaches_the_server_from_a_secret(value_set: str) -> None:
    objects = render_set(value_set)
    container = server_container(objects)
    (env,) = [e for e in container["env"] if e["name"] == cli_args.API_KEY_ENV]
    ref = env["valueFrom"]["secretKeyRef"]
    assert not any(a.startswith("--api-key") for a in container["args"])  # not in `ps`
    if value_set == "cpu":  # the chart creates the Secret from apiKey.value
        secret = find(objects, "Secret")
        assert secret["metadata"]["name"] == ref["name"]
        key = base64.b64decode(secret["data"][ref["key"]]).decode()
        server = parse_server(container["args"], {cli_args.API_KEY_ENV: key})
        assert server.api_key == key == "sk-test-only"


def test_scraped_paths_are_open_routes() -> None:
    objects = render_set("cpu+inference-extension")
    (endpoint,) = find(objects, "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "http"
    assert "GET" in _routes()[endpoint["path"]] and endpoint["path"] in OPEN_PATHS
    # The endpoint picker scrapes /metrics on the pool's target port (its default path).
    assert "/metrics" in OPEN_PATHS


def test_metric_names_read_by_the_cluster() -> None:
    """The names the EPP, the HPA and KEDA read; the live test checks the server exports them."""
    names = scraped_metric_names(render_set("cpu+inference-extension"))
    names |= scraped_metric_names(render_set("gpu-tp2+inference-extension"))
    assert names == {
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:cache_config_info",
    }


@pytest.mark.parametrize("value_set", ["cpu+inference-extension", "gpu-tp2+inference-extension"])
def test_inference_extension_objects_point_at_each_other(value_set: str) -> None:
    objects = render_set(value_set)
    pool = find(objects, "InferencePool")
    container = server_container(objects)
    pod = find(objects, "Deployment", "model-server")["spec"]["template"]
    epp = find(objects, "Deployment", "endpoint-picker")["spec"]["template"]["spec"]
    epp_service = find(objects, "Service", "endpoint-picker")
    route = find(objects, "HTTPRoute")

    assert pool["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert pool["spec"]["targetPorts"] == [{"number": parse_server(container["args"]).port}]
    ref = pool["spec"]["endpointPickerRef"]
    assert ref["name"] == epp_service["metadata"]["name"]
    ports = {p["name"]: p for p in epp_service["spec"]["ports"]}
    assert ref["port"]["number"] == ports["grpc-ext-proc"]["port"]
    args = epp["containers"][0]["args"]
    flags = dict(zip(args[::2], args[1::2], strict=False))
    assert flags["--pool-name"] == pool["metadata"]["name"]
    assert flags["--pool-namespace"] == "llm"
    (mount,) = epp["containers"][0]["volumeMounts"]
    config_map = find(objects, "ConfigMap")
    assert flags["--config-file"].startswith(mount["mountPath"] + "/")
    assert flags["--config-file"].rsplit("/", 1)[1] in config_map["data"]
    assert epp["volumes"][0]["configMap"]["name"] == config_map["metadata"]["name"]
    # The route lets through every name the server answers to (the first is the one reported).
    header = "X-Gateway-Model-Name"  # what the extension's body-based router sets
    names = route_model_names(route, header)
    assert names == list(parse_server(container["args"]).served_model_name) and len(names) > 1
    (rule,) = route["spec"]["rules"]
    (backend,) = rule["backendRefs"]
    assert backend == {"group": "inference.networking.k8s.io", "kind": "InferencePool",
                       "name": pool["metadata"]["name"]}  # fmt: skip


def test_hub_fetch_patterns_are_the_files_the_server_loads() -> None:
    from pagedserve.core.models import resolve

    objects = render_set("hub-fetch")
    init = find(objects, "Deployment")["spec"]["template"]["spec"]["initContainers"][0]
    env = {e["name"]: e.get("value") for e in init["env"]}
    assert env["HUB_ALLOW_PATTERNS"].split() == resolve._HUB_FILES
