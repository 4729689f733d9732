"""Render deploy/helm/pagedserve with a real helm binary and validate what comes out.

Core objects are checked by kubernetes-validate against the Kubernetes OpenAPI schemas (strict:
unknown fields are errors); the objects of other APIs (InferencePool, HTTPRoute, PodMonitor,
ScaledObject) and the endpoint picker's config file against the schemas in deploy/schemas/.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from pagedserve import cli_args
from pagedserve.openai_compat.server_config import ServerConfig

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "pagedserve"
SCHEMAS = ROOT / "deploy" / "schemas"
INSTALL_HELM = ROOT / "deploy" / "tools" / "install_helm.sh"
KUBE_VERSION = "1.30.0"
"""The Kubernetes version the chart is rendered for and validated against."""
RELEASE = "rel"
NAMESPACE = "llm"

# name -> values files under the chart's ci/ folder, applied in order.
VALUE_SETS: dict[str, list[str]] = {
    "defaults": [],
    "cpu": ["cpu-values.yaml"],
    "cpu+inference-extension": ["cpu-values.yaml", "inference-extension-values.yaml"],
    "gpu-tp2": ["gpu-tp2-values.yaml"],
    "gpu-tp2+inference-extension": ["gpu-tp2-values.yaml", "inference-extension-values.yaml"],
    "hub-fetch": ["hub-fetch-values.yaml"],
}

# (apiVersion, kind) -> schema file, for the objects Kubernetes itself does not define.
CUSTOM_SCHEMAS = {
    ("inference.networking.k8s.io/v1", "InferencePool"): "inferencepool-v1.schema.yaml",
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "httproute-v1.schema.yaml",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor-v1.schema.yaml",
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject-v1alpha1.schema.yaml",
}
EPP_CONFIG_SCHEMA = "endpointpickerconfig-v1alpha1.schema.yaml"


class RenderError(Exception):
    """helm refused the values (a `fail` in the chart, or a template error)."""


@cache
def helm_binary() -> str:
    """$PAGEDSERVE_HELM, else the pinned helm that deploy/tools/install_helm.sh installs (it
    returns at once when the binary is already there)."""
    if override := os.environ.get("PAGEDSERVE_HELM"):
        return override
    result = subprocess.run(["bash", str(INSTALL_HELM)], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"no helm binary: {INSTALL_HELM} failed:\n{result.stderr}")
    return result.stdout.strip().splitlines()[-1]


def _template(chart: Path, value_files: list[str], sets: tuple[str, ...], *extra: str) -> str:
    """The output of `helm template` of `chart` with the ci/ values files and --set items."""
    cmd = [helm_binary(), "template", RELEASE, str(chart), "--namespace", NAMESPACE,
           "--kube-version", KUBE_VERSION, *extra]  # fmt: skip
    for name in value_files:
        cmd += ["--values", str(CHART / "ci" / name)]
    for item in sets:
        cmd += ["--set", item]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RenderError(result.stderr)
    return result.stdout


def render(value_files: list[str], sets: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """`helm template` of the chart: every object it renders, in order."""
    return [doc for doc in yaml.safe_load_all(_template(CHART, value_files, sets)) if doc]


def notes(value_files: list[str], sets: tuple[str, ...] = ()) -> str:
    """NOTES.txt as `helm install` would print it (helm template skips it): rendered from a copy
    of the chart where a ConfigMap template carries it through `tpl`."""
    with tempfile.TemporaryDirectory() as tmp:
        chart = Path(tmp) / CHART.name
        shutil.copytree(CHART, chart)
        (chart / "templates" / "NOTES.txt").rename(chart / "notes.in")
        (chart / "templates" / "notes.yaml").write_text(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
            'data:\n  notes: {{ tpl (.Files.Get "notes.in") . | quote }}\n'
        )
        out = _template(chart, value_files, sets, "--show-only", "templates/notes.yaml")
    text: str = yaml.safe_load(out)["data"]["notes"]
    return text


def lint(value_files: list[str]) -> subprocess.CompletedProcess[str]:
    """`helm lint --strict` of the chart with these values (warnings fail too)."""
    cmd = [helm_binary(), "lint", "--strict", str(CHART)]
    for name in value_files:
        cmd += ["--values", str(CHART / "ci" / name)]
    return subprocess.run(cmd, capture_output=True, text=True)


def render_set(name: str, sets: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    return render(VALUE_SETS[name], sets)


def find(objects: list[dict[str, Any]], kind: str, component: str = "") -> dict[str, Any]:
    """The one object of `kind` (with label app.kubernetes.io/component when given)."""
    found = [
        obj
        for obj in objects
        if obj["kind"] == kind
        and (
            not component
            or obj["metadata"]["labels"].get("app.kubernetes.io/component") == component
        )
    ]
    assert len(found) == 1, f"expected one {kind} {component!r}, got {len(found)}"
    return found[0]


def server_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    pod = find(objects, "Deployment", "model-server")["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "pagedserve"]
    return container


@cache
def schema(file_name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((SCHEMAS / file_name).read_text())
    jsonschema.Draft202012Validator.check_schema(loaded)
    return loaded


def validate_custom(obj: dict[str, Any], schema_file: str) -> None:
    """Raises jsonschema.ValidationError (the most relevant error) when obj breaks the schema."""
    validator = jsonschema.Draft202012Validator(schema(schema_file))
    error = jsonschema.exceptions.best_match(validator.iter_errors(obj))
    if error is not None:
        raise error


def validate_object(obj: dict[str, Any]) -> str:
    """Validate one rendered object; returns what it was checked against."""
    key = (obj["apiVersion"], obj["kind"])
    if key in CUSTOM_SCHEMAS:
        validate_custom(obj, CUSTOM_SCHEMAS[key])
        # ObjectMeta is the same for every API: check it with Kubernetes' own schema.
        stand_in = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]}
        kubernetes_validate.validate(stand_in, KUBE_VERSION, strict=True)
        return CUSTOM_SCHEMAS[key]
    kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    return f"kubernetes {KUBE_VERSION}"


def epp_configs(objects: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The EndpointPickerConfig files the chart ships in ConfigMaps."""
    for obj in objects:
        if obj["kind"] == "ConfigMap":
            for text in obj.get("data", {}).values():
                config = yaml.safe_load(text)
                if isinstance(config, dict) and config.get("kind") == "EndpointPickerConfig":
                    yield config


def validate_epp_config(config: dict[str, Any]) -> None:
    """The schema, plus the guide's rule that every pluginRef names a declared plugin (whose
    name defaults to its type)."""
    validate_custom(config, EPP_CONFIG_SCHEMA)
    declared = {plugin.get("name", plugin["type"]) for plugin in config["plugins"]}
    for profile in config.get("schedulingProfiles", []):
        for ref in profile["plugins"]:
            if ref["pluginRef"] not in declared:
                raise ValueError(f"profile {profile['name']!r}: no plugin {ref['pluginRef']!r}")


TP_FLAG = "--tensor-parallel-size"


def parse_server(args: list[str], env: dict[str, str] | None = None) -> ServerConfig:
    """The ServerConfig `pagedserve <args>` builds."""
    parsed = cli_args.build_parser().parse_args(args)
    server, _ = cli_args.configs_from_args(parsed, env or {})
    return server


def route_model_names(route: dict[str, Any], header: str) -> list[str]:
    """The model names an HTTPRoute's rules match (header `header`, as the body-based router
    sets it), in order; [] when no rule looks at the model."""
    return [
        h["value"]
        for rule in route["spec"]["rules"]
        for match in rule["matches"]
        for h in match.get("headers", [])
        if h["name"] == header and h.get("type", "Exact") == "Exact"
    ]


def scraped_metric_names(objects: list[dict[str, Any]]) -> set[str]:
    """Every metric name some object reads from the pods' /metrics."""
    names = set()
    for obj in objects:
        if (
            obj["kind"] == "Deployment"
            and obj["metadata"]["labels"].get("app.kubernetes.io/component") == "endpoint-picker"
        ):
            args = obj["spec"]["template"]["spec"]["containers"][0]["args"]
            names |= {
                v for a, v in zip(args, args[1:], strict=False) if a.endswith("-metric") and v
            }
        if obj["kind"] == "HorizontalPodAutoscaler":
            names |= {m["pods"]["metric"]["name"] for m in obj["spec"]["metrics"]}
        if obj["kind"] == "ScaledObject":
            for trigger in obj["spec"]["triggers"]:
                names |= set(re.findall(r"[a-z_]+:[a-z_]+", trigger["metadata"]["query"]))
    return names
