"""The Dockerfiles install pagedserve with the README's own command and run `pagedserve serve`
with flags the real parser accepts, on the port, paths and model the chart expects.

No image is built here (no Docker daemon and no registry to pull base images from); these checks
read the Dockerfiles with dockerfile-parse."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
import yaml
from dockerfile_parse import DockerfileParser

from pagedserve import cli_args
from pagedserve.core.models import resolve
from pagedserve.openai_compat.app import OPEN_PATHS
from tests.deploy.chart import CHART, ROOT

DOCKER = ROOT / "deploy" / "docker"
DOCKERFILES = {"cpu": DOCKER / "Dockerfile", "gpu": DOCKER / "Dockerfile.cuda"}


def _parse(path: Path) -> DockerfileParser:
    # By file object: DockerfileParser takes a path ending in "Dockerfile" only.
    return DockerfileParser(fileobj=io.BytesIO(path.read_bytes()))


def _instructions(path: Path, name: str) -> list[str]:
    parser = _parse(path)
    return [i["value"] for i in parser.structure if i["instruction"] == name]


def _readme_install_command() -> str:
    """The command of the README's "Set up" block: `./scripts/install.sh && pagedserve serve`."""
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"```bash\n(\./scripts/install\.sh) && pagedserve serve\n```", readme)
    assert match, "README's set-up command changed; update the Dockerfiles with it"
    return match.group(1)


@pytest.mark.parametrize("flavour", list(DOCKERFILES))
def test_installs_with_the_readme_command_and_install_sh_torch_pin(flavour: str) -> None:
    path = DOCKERFILES[flavour]
    runs = _instructions(path, "RUN")
    assert _readme_install_command() in runs
    (pin,) = set(re.findall(r"torch==([\w.+]+)", (ROOT / "scripts" / "install.sh").read_text()))
    pre_installed = [r for r in runs if r.startswith("pip install") and "torch==" in r]
    assert len(pre_installed) == 1 and f'"torch=={pin}"' in pre_installed[0]
    env = " ".join(_instructions(path, "ENV"))
    assert ("PAGEDSERVE_CUDA=ON" if flavour == "gpu" else "PAGEDSERVE_CUDA=OFF") in env
    assert "-DPAGEDSERVE_NATIVE_ARCH=${NATIVE_ARCH}" in env  # portable unless asked


@pytest.mark.parametrize("flavour", list(DOCKERFILES))
def test_runs_pagedserve_serve_where_the_chart_expects(flavour: str) -> None:
    path = DOCKERFILES[flavour]
    (entrypoint,) = _instructions(path, "ENTRYPOINT")
    (cmd,) = _instructions(path, "CMD")
    assert json.loads(entrypoint) == ["pagedserve"]
    args = json.loads(cmd)
    server, engine = cli_args.configs_from_args(cli_args.build_parser().parse_args(args), {})
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert args[0] == "serve" and server.host == "0.0.0.0"
    assert server.port == values["server"]["port"] == int(_instructions(path, "EXPOSE")[0])
    assert engine.model.model == values["model"]["name"] == ""  # the baked-in default model
    if flavour == "gpu":
        assert engine.model.device == "cuda"
    (healthcheck,) = _instructions(path, "HEALTHCHECK")
    url = re.search(r"http://127\.0\.0\.1:(\d+)(/\w+)", healthcheck)
    assert url and int(url.group(1)) == server.port and url.group(2) in OPEN_PATHS


@pytest.mark.parametrize("flavour", list(DOCKERFILES))
def test_bakes_the_default_model_as_the_runtime_user(flavour: str) -> None:
    """The image serves without a network: the default model is fetched at build time into
    the cache folder that `pagedserve serve` (run as the same user) looks in."""
    parser = _parse(DOCKERFILES[flavour])
    after_user = False
    baked = None
    for item in parser.structure:
        if item["instruction"] == "USER":
            after_user = item["value"] != "root"
        if item["instruction"] == "RUN" and "fetch_default_model" in item["value"]:
            baked = item["value"]
            assert after_user, "the model must be fetched as the user that serves"
    assert baked is not None
    assert "fetch_default_model(DEFAULT_CACHE_DIR.expanduser())" in baked
    assert callable(resolve.fetch_default_model) and resolve.DEFAULT_CACHE_DIR


@pytest.mark.parametrize("flavour", list(DOCKERFILES))
def test_build_context_leaves_out_local_state(flavour: str) -> None:
    ignore = (
        DOCKERFILES[flavour].parent / (DOCKERFILES[flavour].name + ".dockerignore")
    ).read_text()
    patterns = {line for line in ignore.splitlines() if line and not line.startswith("#")}
    assert {".git", ".cache", "build", "**/*.so"} <= patterns
