"""The chart renders for every value set, and every object it renders is valid: core objects by
the Kubernetes OpenAPI schemas, the others by the schemas in deploy/schemas/."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from tests.deploy.chart import (
    VALUE_SETS,
    RenderError,
    epp_configs,
    find,
    lint,
    notes,
    render,
    render_set,
    route_model_names,
    server_container,
    validate_custom,
    validate_epp_config,
    validate_object,
)

CORE = {"Deployment", "Service"}
CPU = CORE | {"Secret", "PodMonitor", "HorizontalPodAutoscaler"}
GPU = CORE | {"PodMonitor", "ScaledObject"}
INFERENCE_EXTENSION = {"InferencePool", "HTTPRoute", "ConfigMap", "ServiceAccount", "Role",
                       "RoleBinding", "ClusterRole", "ClusterRoleBinding"}  # fmt: skip
EXPECTED_KINDS: dict[str, set[str]] = {
    "defaults": CORE,
    "cpu": CPU,
    "cpu+inference-extension": CPU | INFERENCE_EXTENSION,
    "gpu-tp2": GPU,
    "gpu-tp2+inference-extension": GPU | INFERENCE_EXTENSION,
    "hub-fetch": CORE,
}


@pytest.mark.parametrize("value_set", list(VALUE_SETS))
def test_every_object_validates(value_set: str) -> None:
    objects = render_set(value_set)
    checked = {}
    for obj in objects:
        checked[f"{obj['kind']}/{obj['metadata']['name']}"] = validate_object(obj)
    configs = list(epp_configs(objects))
    for config in configs:
        validate_epp_config(config)
    assert {obj["kind"] for obj in objects} == EXPECTED_KINDS[value_set]
    assert len(configs) == ("InferencePool" in EXPECTED_KINDS[value_set])
    print(f"{value_set}: {checked}")


@pytest.mark.parametrize("value_set", list(VALUE_SETS))
def test_helm_lint_strict(value_set: str) -> None:
    result = lint(VALUE_SETS[value_set])
    assert result.returncode == 0, result.stdout + result.stderr


def test_gpu_value_set_asks_for_one_gpu_per_rank_on_gpu_nodes() -> None:
    objects = render_set("gpu-tp2")
    pod = find(objects, "Deployment", "model-server")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    model = next(v for v in pod["volumes"] if v["name"] == "model")
    assert model["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}


def test_hub_fetch_downloads_into_the_served_folder() -> None:
    objects = render_set("hub-fetch")
    pod = find(objects, "Deployment", "model-server")["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    env = {e["name"]: e.get("value") for e in init["env"]}
    (container,) = pod["containers"]
    assert env["HUB_ID"] == "HuggingFaceTB/SmolLM2-360M-Instruct"
    assert env["TARGET_DIR"] == container["args"][1] == "/models/model"
    assert pod["terminationGracePeriodSeconds"] == 120


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("autoscaling.hpa.enabled=true", "autoscaling.keda.enabled=true"), "one of hpa and keda"),
        (("model.pvc.claimName=models",), "model.name"),
        (("model.fetch.enabled=true",), "model.fetch.hubId"),
        (("apiKey.create=true",), "apiKey.value"),
        (("termination.gracePeriodSeconds=30",), "termination.gracePeriodSeconds (30)"),
        (("server.tensorParallelSize=0",), "server.tensorParallelSize"),
        (("inferenceExtension.enabled=true", "inferenceExtension.httpRoute.gateway.name="),
         "gateway.name"),
        # values.schema.json: a misspelt or mistyped value is refused, not ignored.
        (("server.gracefulTimout=10",), "gracefulTimout is not allowed"),
        (("server.port=http",), "server.port: Invalid type"),
        (("inferenceExtension.failureMode=FailSoft",), "inferenceExtension.failureMode"),
        (("server.servedModelName=7",), "server.servedModelName: Must validate one and only one"),
        (("server.servedModelName={a,a}",), "server.servedModelName: array items"),
        (("server.servedModelName={}",), "server.servedModelName.0: String length"),
        (("inferenceExtension.httpRoute.matchModelNames=true",),
         "matchModelNames needs server.servedModelName"),
        (("server.servedModelName=a", "inferenceExtension.httpRoute.modelNameHeader=x y"),
         "modelNameHeader"),
    ],
)  # fmt: skip
def test_values_that_cannot_work_are_refused(sets: tuple[str, ...], message: str) -> None:
    with pytest.raises(RenderError, match=message.replace("(", r"\(").replace(")", r"\)")):
        render([], sets)


def _mutated(obj: dict[str, Any], path: list[str | int], value: Any) -> dict[str, Any]:
    """A deep copy of obj with the field at path set to value (None deletes it)."""
    out = copy.deepcopy(obj)
    node: Any = out
    for key in path[:-1]:
        node = node[key]
    if value is None:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


@pytest.mark.parametrize(
    ("kind", "path", "value"),
    [
        ("InferencePool", ["spec", "targetPorts"], [{"number": 8000}, {"number": 8001}]),
        ("InferencePool", ["spec", "targetPorts", 0, "number"], 70000),
        ("InferencePool", ["spec", "endpointPickerRef", "port"], None),
        ("InferencePool", ["spec", "endpointPickerRef", "failureMode"], "FailSometimes"),
        ("InferencePool", ["spec", "selector", "matchLabels"], {}),
        ("InferencePool", ["spec", "extensionRef"], {"name": "epp"}),
        ("HTTPRoute", ["spec", "rules", 0, "timeouts", "request"], "5 minutes"),
        ("HTTPRoute", ["spec", "rules", 0, "backendRefs", 0, "name"], None),
        ("HTTPRoute", ["spec", "rules", 0, "matches", 0, "path", "value"], "v1"),
        ("HTTPRoute", ["spec", "rules", 0, "matches", 0, "headers", 0, "value"], ""),
        ("HTTPRoute", ["spec", "rules", 0, "matches", 0, "headers", 0, "name"], "model name"),
        ("HTTPRoute", ["spec", "rules", 0, "matches", 0, "headers", 0, "type"], "Prefix"),
        ("PodMonitor", ["spec", "podMetricsEndpoints", 0, "interval"], "15 s"),
        ("PodMonitor", ["spec", "selector"], None),
    ],
)
def test_custom_schemas_refuse_broken_objects(kind: str, path: list[Any], value: Any) -> None:
    """The schemas can fail: each documented rule, broken once, is caught."""
    objects = render_set("cpu+inference-extension")
    obj = find(objects, kind)
    validate_object(obj)
    with pytest.raises(jsonschema.ValidationError):
        validate_object(_mutated(obj, path, value))


def test_scaledobject_schema_needs_the_prometheus_query() -> None:
    obj = find(render_set("gpu-tp2"), "ScaledObject")
    broken = _mutated(obj, ["spec", "triggers", 0, "metadata", "query"], None)
    with pytest.raises(jsonschema.ValidationError, match="query"):
        validate_object(broken)


def test_epp_config_checks_plugin_types_and_refs() -> None:
    (config,) = epp_configs(render_set("cpu+inference-extension"))
    with pytest.raises(jsonschema.ValidationError):
        validate_custom(_mutated(config, ["plugins", 0, "type"], "best-pod-scorer"), "endpointpickerconfig-v1alpha1.schema.yaml")  # fmt: skip
    with pytest.raises(ValueError, match="no plugin"):
        validate_epp_config(_mutated(config, ["plugins", 0], {"type": "random-picker"}))


def test_kubernetes_schemas_refuse_unknown_and_mistyped_fields() -> None:
    deployment = find(render_set("cpu"), "Deployment")
    container: list[Any] = ["spec", "template", "spec", "containers", 0]
    for path, value in [
        ([*container, "argz"], ["serve"]),
        ([*container, "ports", 0, "containerPort"], "8000"),
        ([*container, "startupProbe", "httpGet", "path"], 7),
        (["spec", "template", "spec", "terminationGracePeriodSeconds"], "50s"),
    ]:
        with pytest.raises(kubernetes_validate.ValidationError):
            validate_object(_mutated(deployment, path, value))


HEADER = "X-Gateway-Model-Name"


@pytest.mark.parametrize("names", [["one"], ["a", "b", "org/c"]])
def test_served_model_names_become_one_flag_and_route_matches(names: list[str]) -> None:
    """A list renders `--served-model-name a b c`; the route matches every name on the
    body-based router's header, each with the path prefix, and still validates."""
    sets = (f"server.servedModelName={{{','.join(names)}}}", "model.name=org/model")
    objects = render(["inference-extension-values.yaml"], sets)
    args = server_container(objects)["args"]
    flag = args.index("--served-model-name")
    assert args[1] == "org/model" and args[flag + 1 : flag + 1 + len(names)] == names
    after = args[flag + 1 + len(names) :]
    assert after == [] or after[0].startswith("--")  # MODEL came first: nothing closes the names
    route = find(objects, "HTTPRoute")
    validate_object(route)
    assert route_model_names(route, HEADER) == names
    (rule,) = route["spec"]["rules"]
    assert {m["path"]["value"] for m in rule["matches"]} == {"/"}


def test_one_served_name_as_a_string_renders_like_a_list_of_one() -> None:
    as_string = render(["inference-extension-values.yaml"], ("server.servedModelName=m",))
    as_list = render(["inference-extension-values.yaml"], ("server.servedModelName={m}",))
    assert as_string == as_list
    # "" is unset, as before lists were taken: no flag, the model's own name.
    assert render([], ("server.servedModelName=",)) == render([])
    assert "--served-model-name" not in server_container(render([]))["args"]


def test_route_without_model_matching_matches_the_path_only() -> None:
    objects = render_set("cpu+inference-extension", ("inferenceExtension.httpRoute.matchModelNames=false",))  # fmt: skip
    route = find(objects, "HTTPRoute")
    assert route["spec"]["rules"][0]["matches"] == [{"path": {"type": "PathPrefix", "value": "/"}}]
    assert route_model_names(route, HEADER) == []


def test_notes_name_the_first_served_name_as_the_reported_one() -> None:
    text = notes(["cpu-values.yaml", "inference-extension-values.yaml"])
    assert 'Requests name the model "smollm2" (also SmolLM2-135M-Instruct); responses carry "smollm2".' in text  # fmt: skip
    assert f"matches only those model names (header {HEADER}" in text
    assert "Requests name" not in notes([])
