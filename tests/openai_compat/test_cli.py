"""The CLI: flags -> frozen configs, help from the config docstrings, bad values named."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

from bench.common.server import free_port
from pagedserve import cli, cli_args
from pagedserve.cli_args import build_parser, configs_from_args, field_docs
from pagedserve.core.config import CacheConfig
from pagedserve.openai_compat.server_config import ServerConfig


def _configs(argv: list[str], env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return configs_from_args(build_parser().parse_args(["serve", *argv]), env or {})


def test_defaults() -> None:
    server, engine = _configs([])
    assert (server.host, server.port, server.api_key) == ("127.0.0.1", 8000, None)
    assert engine.model.model == "" and engine.cache.enable_prefix_caching


def test_flags_reach_the_configs() -> None:
    server, engine = _configs(["m.gguf", "--port", "9001", "--page-size", "32",
        "--no-enable-prefix-caching", "--max-num-seqs", "8", "--max-waiting", "3",
        "--allowed-origins", "http://a", "http://b", "--num-pages", "40"])  # fmt: skip
    assert server.port == 9001 and server.allowed_origins == ("http://a", "http://b")
    assert engine.model.model == "m.gguf"
    assert engine.cache.page_size == 32 and not engine.cache.enable_prefix_caching
    assert engine.cache.num_pages == 40
    assert engine.scheduler.max_num_seqs == 8 and engine.scheduler.max_waiting == 3


def test_api_key_from_env_and_flag_wins() -> None:
    assert _configs([], {"PAGEDSERVE_API_KEY": "k"})[0].api_key == "k"
    assert _configs(["--api-key", "f"], {"PAGEDSERVE_API_KEY": "k"})[0].api_key == "f"


def test_bad_value_names_the_field() -> None:
    with pytest.raises(ValueError, match="page_size"):
        _configs(["--page-size", "3"])


def test_served_model_name_takes_one_name_or_several() -> None:
    """--served-model-name NAME [NAME ...] (vLLM's); the first is the name responses carry.
    MODEL goes before the flag or right after its names, so `--served-model-name NAME MODEL`
    reads as it always did."""
    server, engine = _configs(["m.gguf", "--served-model-name", "smol"])
    assert (server.served_model_name, server.model_name) == (("smol",), "smol")
    assert engine.model.model == "m.gguf"
    server, engine = _configs(["--served-model-name", "smol", "m.gguf"])
    assert (server.served_model_name, engine.model.model) == (("smol",), "m.gguf")
    server, engine = _configs(["--served-model-name", "smol"])  # the bundled model, named
    assert (server.served_model_name, engine.model.model) == (("smol",), "")
    server, engine = _configs(["m.gguf", "--served-model-name", "smol", "gpt-4o", "--port", "9"])
    assert (server.served_model_name, server.model_name) == (("smol", "gpt-4o"), "smol")
    assert (engine.model.model, server.port) == ("m.gguf", 9)
    server, engine = _configs(["--served-model-name", "smol", "gpt-4o", "m.gguf"])
    assert (server.served_model_name, engine.model.model) == (("smol", "gpt-4o"), "m.gguf")
    server, engine = _configs(["--served-model-name", "smol", "org/model"])  # a hub id
    assert (server.served_model_name, engine.model.model) == (("smol",), "org/model")
    server, _ = _configs([])
    assert (server.served_model_name, server.model_name) == ((), None)
    assert ServerConfig(served_model_name="one").served_model_name == ("one",)


def test_served_names_alone_name_the_bundled_model(tmp_path: Path) -> None:
    """With no MODEL before the flag, its last word is the MODEL only if it names one (a file
    or folder, a .gguf path, a hub id); `--served-model-name a b` serves the bundled model as
    both (it read b as a MODEL that does not exist)."""
    server, engine = _configs(["--served-model-name", "a", "b"])
    assert (server.served_model_name, engine.model.model) == (("a", "b"), "")
    server, engine = _configs(["--served-model-name", "a", "b", "c", "--port", "9"])
    assert (server.served_model_name, engine.model.model) == (("a", "b", "c"), "")
    folder = tmp_path / "my-model"
    folder.mkdir()
    server, engine = _configs(["--served-model-name", "a", str(folder)])
    assert (server.served_model_name, engine.model.model) == (("a",), str(folder))


def test_served_model_names_that_cannot_work_are_refused() -> None:
    with pytest.raises(ValueError, match="served_model_name: smol given more than once"):
        _configs(["m.gguf", "--served-model-name", "smol", "smol"])
    with pytest.raises(ValueError, match="served_model_name: a name must not be empty"):
        _configs(["m.gguf", "--served-model-name", "smol", ""])
    with pytest.raises(ValueError, match="lora_modules: alias is also a --served-model-name"):
        _configs(["m.gguf", "--served-model-name", "smol", "alias", "--lora-modules", "alias=a"])
    with pytest.raises(SystemExit):  # argparse's usage error: the flag needs a name
        build_parser().parse_args(["serve", "m.gguf", "--served-model-name"])


def test_help_comes_from_docstrings() -> None:
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    text = serve.format_help()
    first_words = field_docs(CacheConfig)["page_size"].split()[:3]
    assert " ".join(first_words) in " ".join(text.split())
    assert "--num-pages" not in text  # advanced: hidden
    assert "--served-model-name NAME [NAME ...]" in text


def test_serve_exits_1_when_the_model_cannot_load(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.gguf")
    cmd = [sys.executable, "-m", "pagedserve", "serve", missing, "--port", str(free_port())]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "missing.gguf" in done.stderr


def test_malloc_arenas_capped_unless_the_environment_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    assert cli.limit_malloc_arenas() is glibc
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert cli.limit_malloc_arenas() is False


@pytest.mark.skipif(sys.platform == "win32", reason="uvloop is not a dependency on Windows")
def test_the_server_runs_on_uvloop() -> None:
    """uvloop is a dependency (pyproject.toml) and the server's loop (cli._run): less CPU per
    streamed chunk, left to the model's threads."""
    import asyncio

    async def on_uvloop() -> int:
        return int(type(asyncio.get_running_loop()).__module__.startswith("uvloop"))

    assert cli._run(on_uvloop()) == 1


def test_kv_events_config_takes_vllms_json_and_names_what_is_wrong() -> None:
    flag = ('{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", '
            '"replay_endpoint": "tcp://*:5558", "topic": "kv"}')  # fmt: skip
    events = _configs(["--kv-events-config", flag])[1].kv_events
    assert events.enabled and events.replay_endpoint == "tcp://*:5558" and events.topic == "kv"
    assert not _configs([])[1].kv_events.enabled
    for bad, named in [("{", "not valid JSON"), ('{"hwm": "1"}', "hwm"),
                       ('{"publisher": "kafka"}', "publisher"), ('{"port": 1}', "'port'")]:  # fmt: skip
        with pytest.raises(ValueError, match=named):
            _configs(["--kv-events-config", bad])


def test_models_flags_reach_the_pool_and_refuse_a_model_beside_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--models-dir and the pool's limits (issue 39); a MODEL or --served-model-name with them,
    or a folder without models, is the usage error (exit 2) naming it."""
    parser = build_parser()
    args = parser.parse_args(["serve", "--models-dir", str(tmp_path), "--max-loaded-models", "2",
                              "--models-memory", "4.5", "--idle-unload", "30"])  # fmt: skip
    models = cli_args.models_from_args(args)
    assert (models.models_dir, models.max_loaded_models) == (str(tmp_path), 2)
    assert (models.models_memory, models.idle_unload, models.catalog) == (4.5, 30.0, True)
    assert not cli_args.models_from_args(parser.parse_args(["serve", "--idle-unload", "5"])).catalog
    with pytest.raises(ValueError, match="served-model-name"):
        cli_args.models_from_args(parser.parse_args(["serve", "--models-dir", "d", "x.gguf"]))
    several = ["serve", "--models-dir", "d", "--served-model-name", "a", "b", "--port", "9"]
    with pytest.raises(ValueError, match="served-model-name"):
        cli_args.models_from_args(parser.parse_args(several))
    for argv, message in (
        (["--models-dir", str(tmp_path)], "no model found"),
        (["--models-dir", str(tmp_path), "--max-loaded-models", "-1"], "max_loaded_models"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["serve", *argv])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
