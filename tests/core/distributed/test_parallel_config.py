"""ParallelConfig's checks, and the CLI's flags and torch.distributed's environment."""

from __future__ import annotations

import pytest

from pagedserve import cli_args
from pagedserve.core.config import ParallelConfig


def _parallel(argv: list[str], env: dict[str, str]) -> ParallelConfig:
    args = cli_args.build_parser().parse_args(["serve", *argv])
    return cli_args.configs_from_args(args, env)[1].parallel


def test_flags_then_environment_then_defaults() -> None:
    assert _parallel([], {}) == ParallelConfig()
    env = {"WORLD_SIZE": "4", "NNODES": "2", "RANK": "1", "MASTER_ADDR": "10.0.0.1",
           "MASTER_PORT": "29500"}  # fmt: skip
    from_env = _parallel([], env)
    assert (from_env.tensor_parallel_size, from_env.nnodes, from_env.node_rank) == (4, 2, 1)
    assert (from_env.master_addr, from_env.master_port) == ("10.0.0.1", 29500)
    assert list(from_env.node_ranks()) == [2, 3]
    flags = _parallel(["--tensor-parallel-size", "2", "--node-rank", "0"], env)
    assert (flags.tensor_parallel_size, flags.node_rank, flags.nnodes) == (2, 0, 2)
    assert _parallel([], {**env, "NODE_RANK": "0"}).node_rank == 0  # NODE_RANK before RANK


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"tensor_parallel_size": 0}, "tensor_parallel_size must be >= 1"),
        ({"tensor_parallel_size": 3, "nnodes": 2}, r"nnodes \(2\) must be >= 1 and divide"),
        ({"tensor_parallel_size": 2, "nnodes": 2, "node_rank": 2}, "node_rank must be in"),
        ({"tensor_parallel_size": 2, "nnodes": 2}, "master_port: give a fixed port"),
        ({"distributed_timeout": 0}, "distributed_timeout must be > 0"),
    ],
)
def test_bad_values_name_the_field(fields: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ParallelConfig(**fields)  # type: ignore[arg-type]


def test_bad_environment_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="WORLD_SIZE='two'"):
        _parallel([], {"WORLD_SIZE": "two"})
