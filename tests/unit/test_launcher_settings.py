"""launcher.settings: the cluster file's [launcher] and [cluster] tables and the rules of
placing its engines, with the errors they give."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.settings import EngineCluster, LaunchConfig, LauncherConfig, load_launch_config
from router.config import cluster as cc
from router.config.cluster import ConfigError, load_cluster_config
from tests.unit.test_cluster_config import ENGINE_A, ENGINE_B, ROUTER, write


@pytest.fixture(autouse=True)
def no_policy_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Policy-settings validation belongs to router.policies; tests opt in to it."""
    monkeypatch.setattr(cc, "_policy_validator", lambda: None)


def load(tmp_path: Path, text: str) -> LaunchConfig:
    return load_launch_config(write(tmp_path, text))


def error(tmp_path: Path, text: str, key: str) -> str:
    """Load ``text``; assert it fails naming the file and ``key``; return the problem."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_launch_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: {key}: "), message
    return info.value.problem


def test_round_trip(tmp_path: Path) -> None:
    text = (ROUTER + 'port = 9000\n[router.policies.chimera]\nstatic_prior = true\n'
            + ENGINE_A + 'replicas = 2\nport = [9100, 9102]\nnum_gpus = 2\n'
            'extra_args = ["--swap-space", "1"]\nenv = { FOO = "1" }\n' + ENGINE_B
            + 'gpus = [4]\ngpu_memory_utilization = 0.5\ncpus = [1]\n'
            '[launcher]\nmax_restarts = 2\n')
    cfg = load(tmp_path, text)
    again = load_launch_config(write(tmp_path / "..", cfg.to_toml()))
    assert again.router == cfg.router
    assert again.engines == cfg.engines
    assert again.launcher == cfg.launcher


def test_the_router_takes_the_launcher_tables_as_they_are(tmp_path: Path) -> None:
    text = ROUTER + ENGINE_A + "[launcher]\nmax_restarts = 2\n[cluster]\nbackend = \"ray\"\n"
    assert load_cluster_config(write(tmp_path, text)).engines[0].name == "a"
    cfg = load(tmp_path, text)
    assert (cfg.launcher.max_restarts, cfg.cluster.backend) == (2, "ray")


def test_unknown_key_suggests(tmp_path: Path) -> None:
    problem = error(tmp_path, ROUTER + ENGINE_A + "[launcher]\ngrace_period = 3\n",
                    "launcher.grace_period")
    assert problem.startswith("unknown key")
    assert "did you mean 'grace_period_s'?" in problem


def test_two_engines_on_one_gpu_beyond_its_share(tmp_path: Path) -> None:
    problem = error(tmp_path, ROUTER + ENGINE_A + "gpus = [0]\n" + ENGINE_B + "gpus = [0]\n",
                    "engines.b.gpus")
    assert "GPU 0 is shared beyond its memory" in problem
    assert "a-0 (0.9) + b-0 (0.9)" in problem


def test_two_engines_on_one_gpu_within_its_share(tmp_path: Path) -> None:
    cfg = load(tmp_path, ROUTER + ENGINE_A + "gpus = [0]\ngpu_memory_utilization = 0.5\n"
               + ENGINE_B + "gpus = [0]\ngpu_memory_utilization = 0.45\n")
    assert [e.gpus for e in cfg.engines] == [[0], [0]]


@pytest.mark.parametrize("text,key,words", [
    (ROUTER + ENGINE_A + 'extra_args = ["--port", "1"]\n', "engines.a.extra_args[0]",
     "use the key `port`"),
    (ROUTER + ENGINE_A + 'extra_args = ["--max_num_seqs=4"]\n', "engines.a.extra_args[0]",
     "use the key `max_num_seqs`"),
    (ROUTER + ENGINE_A + 'env = { CUDA_VISIBLE_DEVICES = "1" }\n',
     "engines.a.env.CUDA_VISIBLE_DEVICES", "use `gpus`"),
    (ROUTER + ENGINE_A + "cpus = [0]\n" + ENGINE_B + "cpus = [0, 1]\n", "engines.b.cpus",
     "core 0 is also given to engines.a"),
])
def test_invalid_values(tmp_path: Path, text: str, key: str, words: str) -> None:
    assert words in error(tmp_path, text, key)


def test_hostile_value_gets_one_short_error(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.undo()  # with the policy registry
    problem = error(tmp_path, ROUTER + ENGINE_A + "[launcher]\nmax_restarts = " + str(2**64)
                    + "\n", "launcher.max_restarts")
    assert "must be <=" in problem and len(problem) < 400


_TABLES = {"launcher": (LauncherConfig, ROUTER + ENGINE_A + "[launcher]\n"),
           "cluster": (EngineCluster, ROUTER + ENGINE_A + "[cluster]\n")}


@pytest.mark.parametrize("table,name", [(t, f) for t, (cls, _) in _TABLES.items()
                                        for f in cls.__pydantic_fields__])
def test_a_wrong_type_anywhere_names_its_key(tmp_path: Path, table: str, name: str) -> None:
    """Every key of the launcher's tables, given a table where it takes none, fails
    naming that key."""
    _, head = _TABLES[table]
    problem = error(tmp_path, head + f"{name} = {{ z = [1] }}\n", f"{table}.{name}")
    assert problem.startswith("expected "), problem


@pytest.mark.parametrize("extra, key", [
    ('extra_args = ["--api-key", "x"]\n', "engines.a.extra_args[0]"),
    ('env = { VLLM_API_KEY = "x" }\n', "engines.a.env.VLLM_API_KEY"),
])
def test_engine_api_key_only_by_its_key(tmp_path: Path, extra: str, key: str) -> None:
    error(tmp_path, ROUTER + ENGINE_A + extra, key)


EXAMPLES = sorted((Path(__file__).parents[2] / "examples").rglob("*.toml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_cluster_file_loads(path: Path) -> None:
    """The cluster files docs and benchmarks name (examples/, examples/twin/) load as the
    launcher loads them: router, policies and engines checked."""
    cfg = load_launch_config(path)
    assert cfg.engines
