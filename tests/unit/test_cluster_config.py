"""router.config: the cluster file schema, its validation errors and its resolved form
(the launcher's tables and placement rules: test_launcher_settings)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from router.config import cluster as cc
from router.config.cluster import ConfigError, load_cluster_config
from router.config.engines import SCHED_POLICIES, LocalEngine
from router.settings import SettingsError

ROUTER = '[router]\npolicy = "chimera"\n'
ENGINE_A = '[[engines]]\nname = "a"\nmodel = "builtin:tiny-a"\n'
ENGINE_B = '[[engines]]\nname = "b"\nmodel = "builtin:tiny-b"\n'
KEYS = 'telemetry_keys_dir = "keys"\n'
"""A ``[router]`` line: CURVE keys, so telemetry endpoints may leave loopback."""


@pytest.fixture(autouse=True)
def no_policy_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Policy-settings validation belongs to router.policies; tests opt in to it."""
    monkeypatch.setattr(cc, "_policy_validator", lambda: None)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    return path


def load(tmp_path: Path, text: str) -> cc.ClusterConfig:
    return load_cluster_config(write(tmp_path, text))


def error(tmp_path: Path, text: str, key: str) -> str:
    """Load ``text``; assert it fails naming the file and ``key``; return the problem."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_cluster_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: {key}: "), message
    return info.value.problem


# ---------------------------------------------------------------- valid files


def test_defaults_are_loopback_and_names(tmp_path: Path) -> None:
    cfg = load(tmp_path, ROUTER + ENGINE_A)
    assert cfg.router.host == "127.0.0.1"
    assert cfg.router.port is None
    assert cfg.router.heartbeat_timeout_s == 1.5
    assert cfg.router.allow_client_priority is False
    (e,) = cfg.engines
    assert e.host == "127.0.0.1"
    assert e.served_model_name == "a"
    assert e.tensor_parallel_size == 1 and e.replicas == 1 and not e.remote


def test_demo_file_loads() -> None:
    cfg = load_cluster_config(Path(__file__).parents[2] / "examples" / "demo.toml")
    assert [(e.name, e.model, e.served_model_name) for e in cfg.engines] == [
        ("tiny-a", "builtin:tiny-a", "tiny-a"), ("tiny-b", "builtin:tiny-b", "tiny-b")]
    assert cfg.router.policy == "chimera"
    assert cfg.router.policies["chimera"]["static_prior"] is True
    for e in cfg.engines:
        assert (e.max_num_seqs, e.dtype, e.enforce_eager, e.max_model_len) == (
            8, "float32", True, 1024)


def test_router_tables(tmp_path: Path) -> None:
    cfg = load(tmp_path, ROUTER + 'port = 9000\nuds = "r.sock"\nallow_client_priority = true\n'
               '[router.predictors]\nlength = "artifacts/qrf.pkl"\n'
               '[router.policies.chimera]\ntau = 0.5\n[router.policies.lmetric]\n'
               + ENGINE_A)
    r = cfg.router
    assert r.port == 9000 and r.allow_client_priority
    assert r.uds == str(tmp_path / "r.sock")
    assert r.predictors == {"length": str(tmp_path / "artifacts" / "qrf.pkl")}
    assert r.policies == {"chimera": {"tau": 0.5}, "lmetric": {}}
    assert cfg.router_url() == "http://127.0.0.1:9000"


def test_integer_accepted_for_float(tmp_path: Path) -> None:
    cfg = load(tmp_path, ROUTER + "heartbeat_timeout_s = 3\n" + ENGINE_A)
    assert cfg.router.heartbeat_timeout_s == 3


def test_local_model_path_made_absolute(tmp_path: Path) -> None:
    (tmp_path / "models" / "m").mkdir(parents=True)
    cfg = load(tmp_path, ROUTER + '[[engines]]\nname = "a"\nmodel = "./models/m"\n')
    assert cfg.engines[0].model == str(tmp_path / "models" / "m")


def test_hub_id_passes(tmp_path: Path) -> None:
    cfg = load(tmp_path, ROUTER + '[[engines]]\nname = "a"\nmodel = "Qwen/Qwen2.5-0.5B"\n')
    assert cfg.engines[0].model == "Qwen/Qwen2.5-0.5B"


def test_instances_of_resolved_file(tmp_path: Path) -> None:
    cfg = load(tmp_path, ROUTER + 'port = 9000\n' + ENGINE_A + 'replicas = 2\nport = 9100\n'
               'host = "0.0.0.0"\ntelemetry_endpoint = "tcp://127.0.0.1:9200"\n'
               'kv_events_endpoint = ["ipc:///tmp/a0.kv", "ipc:///tmp/a1.kv"]\n'
               'max_model_len = 512\nmax_num_seqs = 4\n')
    a0, a1 = cfg.instances()
    assert (a0.name, a0.engine, a0.replica, a0.port) == ("a-0", "a", 0, 9100)
    assert (a1.name, a1.port, a1.url) == ("a-1", 9101, "http://127.0.0.1:9101")
    assert a0.telemetry_endpoint == a1.telemetry_endpoint == "tcp://127.0.0.1:9200"
    assert (a0.kv_events_endpoint, a1.kv_events_endpoint) == ("ipc:///tmp/a0.kv",
                                                              "ipc:///tmp/a1.kv")
    assert (a0.max_model_len, a0.max_num_seqs, a0.remote) == (512, 4, False)


def test_instances_need_ports(tmp_path: Path) -> None:
    cfg = load(tmp_path, ROUTER + ENGINE_A)
    with pytest.raises(ConfigError, match=r"engines\.a\.port: not set"):
        cfg.instances()


def test_remote_engine(tmp_path: Path) -> None:
    cfg = load(tmp_path, ROUTER + KEYS + '[[engines]]\nname = "big-0"\n'
               'url = "http://10.0.0.7:8101"\nserved_model_name = "big"\ntelemetry_endpoint = "tcp://10.0.0.2:5601"\n'
               'kv_events_endpoint = "tcp://10.0.0.2:5602"\nmax_model_len = 4096\n')
    (inst,) = cfg.instances()
    assert inst.remote and inst.name == "big-0" and inst.served_model_name == "big"
    assert (inst.url, inst.port, inst.model) == ("http://10.0.0.7:8101", 8101, None)
    assert inst.telemetry_endpoint == "tcp://10.0.0.2:5601"


def test_sched_policies_match_engine() -> None:
    from scheduler_patches.settings import ENGINE_POLICIES

    assert SCHED_POLICIES == ENGINE_POLICIES


# ---------------------------------------------------------------- errors


def test_syntax_error_names_file(tmp_path: Path) -> None:
    assert "line 1" in error(tmp_path, "[router\n", "(syntax)")


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match=r"^nowhere\.toml: \(file\): cannot read"):
        load_cluster_config("nowhere.toml")


@pytest.mark.parametrize("text,key,hint", [
    (ROUTER + ENGINE_A + "max_num_seq = 8\n", "engines.a.max_num_seq", "'max_num_seqs'"),
    (ROUTER + "polcy_settings = 1\n" + ENGINE_A, "router.polcy_settings", None),
    (ROUTER + "heartbeat_timeout = 1.0\n" + ENGINE_A, "router.heartbeat_timeout",
     "'heartbeat_timeout_s'"),
    (ROUTER + ENGINE_A + "[routers]\n", "routers", "'router'"),
])
def test_unknown_key_suggests(tmp_path: Path, text: str, key: str, hint: str | None) -> None:
    problem = error(tmp_path, text, key)
    assert problem.startswith("unknown key")
    if hint:
        assert f"did you mean {hint}?" in problem


@pytest.mark.parametrize("text,key,expected", [
    (ROUTER + ENGINE_A + 'max_num_seqs = "8"\n', "engines.a.max_num_seqs", "an integer"),
    (ROUTER + ENGINE_A + "max_num_seqs = true\n", "engines.a.max_num_seqs", "an integer"),
    (ROUTER + ENGINE_A + "enforce_eager = 1\n", "engines.a.enforce_eager", "true or false"),
    (ROUTER + ENGINE_A + 'port = "x"\n', "engines.a.port", "an integer or a list"),
    (ROUTER + ENGINE_A + 'port = [9100, "x"]\n', "engines.a.port[1]", "an integer"),
    (ROUTER + ENGINE_A + "extra_args = \"--foo\"\n", "engines.a.extra_args",
     "a list"),
    (ROUTER + ENGINE_A + "env = { X = 1 }\n", "engines.a.env.X", "a string"),
    (ROUTER + ENGINE_A + "gpus = [0, 1.5]\n", "engines.a.gpus[1]", "an integer"),
    (ROUTER + 'heartbeat_timeout_s = "2"\n' + ENGINE_A, "router.heartbeat_timeout_s",
     "a number"),
    ('router = 3\n' + ENGINE_A, "router", "a table"),
    (ROUTER + "[router.policies]\nchimera = 1\n" + ENGINE_A, "router.policies.chimera",
     "a table"),
])
def test_wrong_type(tmp_path: Path, text: str, key: str, expected: str) -> None:
    assert error(tmp_path, text, key).startswith(f"expected {expected}, got ")


@pytest.mark.parametrize("text,key", [
    (ENGINE_A, "router"),
    (ROUTER, "engines"),
    ('[router]\nport = 1\n' + ENGINE_A, "router.policy"),
    (ROUTER + '[[engines]]\nmodel = "builtin:tiny-a"\n', "engines[0].name"),
    (ROUTER + '[[engines]]\nname = "a"\n', "engines.a.model"),
])
def test_missing(tmp_path: Path, text: str, key: str) -> None:
    assert error(tmp_path, text, key).startswith("missing")


def test_tp_larger_than_gpus_given(tmp_path: Path) -> None:
    problem = error(tmp_path, ROUTER + ENGINE_A + "gpus = [0, 1]\ntensor_parallel_size = 4\n",
                    "engines.a.tensor_parallel_size")
    assert "tensor_parallel_size 4 is larger than the 2 GPUs given" in problem
    problem = error(tmp_path, ROUTER + ENGINE_A + "num_gpus = 2\ntensor_parallel_size = 4\n",
                    "engines.a.tensor_parallel_size")
    assert "larger than the 2 GPUs given" in problem


def test_gpus_must_cover_replicas(tmp_path: Path) -> None:
    problem = error(tmp_path, ROUTER + ENGINE_A + "replicas = 2\ngpus = [0, 1, 2]\n"
                    "tensor_parallel_size = 2\n", "engines.a.gpus")
    assert "2 replicas x tensor_parallel_size 2 need 4" in problem


def test_num_gpus_sets_tp(tmp_path: Path) -> None:
    assert load(tmp_path, ROUTER + ENGINE_A + "num_gpus = 4\n").engines[0] \
        .tensor_parallel_size == 4


@pytest.mark.parametrize("text,key,owner", [
    (ROUTER + "port = 9000\n" + ENGINE_A + "port = 9000\n", "engines.a.port", "router.port"),
    (ROUTER + ENGINE_A + "replicas = 2\nport = 9100\n" + ENGINE_B + "port = 9101\n",
     "engines.b.port", "engines.a.port (replica 1)"),
    (ROUTER + "port = 9000\n" + ENGINE_A + 'telemetry_endpoint = "tcp://127.0.0.1:9000"\n',
     "engines.a.telemetry_endpoint", "router.port"),
])
def test_port_clash(tmp_path: Path, text: str, key: str, owner: str) -> None:
    assert error(tmp_path, text, key).endswith(f"is also used by {owner}")


def test_endpoint_clash(tmp_path: Path) -> None:
    ep = 'telemetry_endpoint = "ipc:///tmp/x.telemetry"\n'
    assert "endpoint clash" in error(tmp_path, ROUTER + ENGINE_A + ep + ENGINE_B + ep,
                                     "engines.b.telemetry_endpoint")
    tcp = "tcp://127.0.0.1:9300"
    problem = error(tmp_path, ROUTER + ENGINE_A + f'telemetry_endpoint = "{tcp}"\n'
                    + ENGINE_B + f'kv_events_endpoint = "{tcp}"\n',
                    "engines.b.kv_events_endpoint")
    assert "endpoint clash" in problem


def test_router_bound_endpoint_may_be_shared(tmp_path: Path) -> None:
    tcp = 'telemetry_endpoint = "tcp://127.0.0.1:9300"\n'
    cfg = load(tmp_path, ROUTER + ENGINE_A + tcp + ENGINE_B + tcp)
    assert cfg.engines[0].telemetry_endpoint == cfg.engines[1].telemetry_endpoint


def test_engine_bound_endpoint_needs_one_per_replica(tmp_path: Path) -> None:
    problem = error(tmp_path, ROUTER + ENGINE_A + 'replicas = 2\n'
                    'kv_events_endpoint = "ipc:///tmp/a.kv"\n', "engines.a.kv_events_endpoint")
    assert "give a list" in problem


def test_missing_model_path(tmp_path: Path) -> None:
    problem = error(tmp_path, ROUTER + '[[engines]]\nname = "a"\nmodel = "./models/none"\n',
                    "engines.a.model")
    assert problem.startswith("local model path './models/none' does not exist")


def test_unknown_builtin_model(tmp_path: Path) -> None:
    problem = error(tmp_path, ROUTER + '[[engines]]\nname = "a"\nmodel = "builtin:tiny-c"\n',
                    "engines.a.model")
    assert "unknown built-in model 'builtin:tiny-c'" in problem
    assert "did you mean 'builtin:tiny-a'?" in problem or "'builtin:tiny-b'?" in problem


@pytest.mark.parametrize("text,key,words", [
    (ROUTER + ENGINE_A + 'sched_policy = "stfj"\n', "engines.a.sched_policy",
     "did you mean 'stjf'?"),
    (ROUTER + ENGINE_A + "replicas = 0\n", "engines.a.replicas", "must be >= 1, got 0"),
    (ROUTER + ENGINE_A + "replicas = 2\nport = [9100]\n", "engines.a.port",
     "gives 1 ports for 2 replicas"),
    (ROUTER + ENGINE_A + "port = 70000\n", "engines.a.port", "must be <= 65535, got 70000"),
    (ROUTER + ENGINE_A + 'replicas = 2\ntelemetry_endpoint = ["ipc:///tmp/a"]\n',
     "engines.a.telemetry_endpoint", "gives 1 endpoints for 2 replicas"),
    (ROUTER + ENGINE_A + "gpu_memory_utilization = 1.5\n",
     "engines.a.gpu_memory_utilization", "must be <= 1"),
    (ROUTER + ENGINE_A + 'served_model_name = "auto"\n', "engines.a.served_model_name",
     "reserved"),
    (ROUTER + ENGINE_A + ENGINE_A, "engines[1].name", "already the name"),
    (ROUTER + ENGINE_A + '[[engines]]\nname = "b"\nmodel = "builtin:tiny-b"\n'
     'served_model_name = "a"\n', "engines.b.served_model_name", "another model"),
    (ROUTER + '[[engines]]\nname = "a b"\nmodel = "builtin:tiny-a"\n', "engines[0].name",
     "must match '^[A-Za-z0-9][A-Za-z0-9_.-]*$', got 'a b'"),
    (ROUTER + ENGINE_A + 'telemetry_endpoint = "udp://x"\n', "engines.a.telemetry_endpoint",
     "must match '^(ipc|tcp)://', got 'udp://x'"),
])
def test_invalid_values(tmp_path: Path, text: str, key: str, words: str) -> None:
    assert words in error(tmp_path, text, key)


@pytest.mark.parametrize("extra,key,words", [
    ('gpus = [0]\n', "engines.r-0.gpus", "not allowed for a remote engine"),
    ('replicas = 2\n', "engines.r-0.replicas", "a remote engine is one instance"),
])
def test_remote_engine_keys(tmp_path: Path, extra: str, key: str, words: str) -> None:
    remote = ('[[engines]]\nname = "r-0"\nurl = "http://10.0.0.7:8101"\n'
              'telemetry_endpoint = "tcp://10.0.0.2:5601"\n'
              'kv_events_endpoint = "tcp://10.0.0.2:5602"\n')
    assert words in error(tmp_path, ROUTER + KEYS + remote + extra, key)


def test_remote_engine_needs_endpoints_and_url(tmp_path: Path) -> None:
    base = '[[engines]]\nname = "r-0"\nurl = "http://10.0.0.7:8101"\n'
    assert "required for a remote engine" in error(tmp_path, ROUTER + base,
                                                   "engines.r-0.telemetry_endpoint")
    bad = ('[[engines]]\nname = "r-0"\nurl = "10.0.0.7"\ntelemetry_endpoint = "tcp://h:1"\n'
           'kv_events_endpoint = "tcp://h:2"\n')
    assert "expected http://HOST:PORT" in error(tmp_path, ROUTER + KEYS + bad,
                                                "engines.r-0.url")


def test_telemetry_beyond_loopback_needs_keys_or_insecure(tmp_path: Path) -> None:
    remote = ('[[engines]]\nname = "r-0"\nurl = "http://10.0.0.7:8101"\n'
              'telemetry_endpoint = "tcp://127.0.0.1:5601"\n'
              'kv_events_endpoint = "tcp://*:5602"\n')
    assert "'tcp://*:5602' is beyond loopback" in error(
        tmp_path, ROUTER + remote, "engines.r-0.kv_events_endpoint")
    cfg = load(tmp_path, ROUTER + KEYS + remote)
    assert cfg.router.telemetry_keys_dir == str(tmp_path / "keys")
    assert load(tmp_path, ROUTER + 'insecure = true\n' + remote).router.insecure


def test_policies_go_to_router_registry(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, dict[str, Any]]] = []

    def validate(name: str, table: dict[str, Any]) -> None:
        seen.append((name, table))
        if table.get("tau", 0) < 0:
            raise SettingsError(f"router.policies.{name}.tau", "must not be negative")
        if "bad" in table:
            raise SettingsError(f"router.policies.{name}", "something is wrong")

    monkeypatch.setattr(cc, "_policy_validator", lambda: validate)
    load(tmp_path, ROUTER + "[router.policies.lmetric]\nwindow = 3\n" + ENGINE_A)
    assert seen == [("chimera", {}), ("lmetric", {"window": 3})]
    problem = error(tmp_path, ROUTER + "[router.policies.chimera]\ntau = -1\n" + ENGINE_A,
                    "router.policies.chimera.tau")
    assert problem == "must not be negative"
    problem = error(tmp_path, ROUTER + "[router.policies.chimera]\nbad = 1\n" + ENGINE_A,
                    "router.policies.chimera")
    assert problem == "something is wrong"


def test_demo_file_passes_the_router_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.undo()
    assert cc._policy_validator() is not None
    load_cluster_config(Path(__file__).parents[2] / "examples" / "demo.toml")


def test_without_policy_registry_only_the_name_is_checked(tmp_path: Path) -> None:
    assert load(tmp_path, '[router]\npolicy = "anything"\n' + ENGINE_A).router.policy == \
        "anything"
    assert "must not be empty" in error(tmp_path, '[router]\npolicy = " "\n' + ENGINE_A,
                                        "router.policy")


# ---------------------------------------------------------------- hostile files


def _short(problem: str) -> str:
    assert len(problem) < 400, problem[:400]
    return problem


@pytest.mark.parametrize("text,key,words", [
    (ROUTER + ENGINE_A + f"replicas = {10**40}\n", "engines.a.replicas", "must be <= 4096"),
    (ROUTER + ENGINE_A + f"kv_cache_bytes = {10**40}\n", "engines.a.kv_cache_bytes",
     "must be <="),
    (ROUTER + f"port = -{10**40}\n" + ENGINE_A, "router.port", "must be >= 1"),
    (ROUTER + "heartbeat_timeout_s = nan\n" + ENGINE_A, "router.heartbeat_timeout_s",
     "must be finite"),
    (ROUTER + "request_timeout_s = inf\n" + ENGINE_A, "router.request_timeout_s",
     "must be finite"),
    (ROUTER + ENGINE_A + 'dtype = "' + "x" * 50_000_000 + '"\n', "engines.a.dtype",
     "must be at most 4096 characters, got 50000000"),
    (ROUTER + "[router.policies.chimera" + ".a" * 100 + "]\n" + ENGINE_A,
     "router.policies.chimera.a", "unknown key"),
    (ROUTER + ENGINE_A + "env = " + "{ a = " * 100 + "1" + " }" * 100 + "\n",
     "engines.a.env.a", "expected a string, got a table"),
    (ROUTER + ENGINE_A + f"max_num_seqs = {10**4000}\n", "engines.a.max_num_seqs",
     "got 4001 digits"),
])
def test_hostile_values_get_one_short_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            text: str, key: str, words: str) -> None:
    monkeypatch.undo()  # with the policy registry
    assert words in _short(error(tmp_path, text, key))


def test_no_engines(tmp_path: Path) -> None:
    assert error(tmp_path, "engines = []\n" + ROUTER, "engines") == \
        "needs at least 1 entries, got 0"


@pytest.mark.parametrize("value", ["[" * 100_000 + "]" * 100_000, "9" * 5000])
def test_values_tomllib_cannot_hold_are_a_syntax_error(tmp_path: Path, value: str) -> None:
    problem = error(tmp_path, ROUTER + f"x = {value}\n" + ENGINE_A, "(syntax)")
    assert "nested too deeply or too large" in _short(problem)


_TABLES = {"router": (list(cc.RouterConfig.__pydantic_fields__), ROUTER, ENGINE_A),
           "engines.a": ([*LocalEngine.__pydantic_fields__, "url"], ROUTER + ENGINE_A, "")}


@pytest.mark.parametrize("table,name", [(t, f) for t, (keys, _, _) in _TABLES.items()
                                        for f in keys
                                        if f not in ("name", "policy", "model")])
def test_a_wrong_type_anywhere_names_its_key(tmp_path: Path, table: str, name: str) -> None:
    """Every key of every table, given a table where it takes none (or a table of lists
    where it takes a table), fails naming that key."""
    _, head, tail = _TABLES[table]
    problem = error(tmp_path, head + f"{name} = {{ z = [1] }}\n" + tail,
                    f"{table}.{name}" + (".z" if name in ("policies", "predictors", "env", "resources")
                                         else ""))
    assert problem.startswith("expected "), problem


@pytest.mark.parametrize("router, engine_extra, key, fragment", [
    ('workers = 2\nuds = "r.sock"\n', "", "router.uds", "served by one process"),
    ('workers = 2\nworker_ports = [9001]\n', "", "router.worker_ports",
     "gives 1 ports for 2 workers"),
    ("workers = 2\n", 'telemetry_endpoint = "tcp://127.0.0.1:7000"\n',
     "engines.a.telemetry_endpoint", "2 workers cannot share"),
    ("workers = 0\n", "", "router.workers", None),
])
def test_router_workers_refusals(tmp_path: Path, router: str, engine_extra: str, key: str,
                                 fragment: str | None) -> None:
    problem = error(tmp_path, ROUTER + router + ENGINE_A + engine_extra, key)
    assert fragment is None or fragment in problem


def test_router_workers_with_vinelm_refused(tmp_path: Path) -> None:
    text = ROUTER.replace("chimera", "vinelm") + "workers = 2\n" + ENGINE_A
    assert "run one worker" in error(tmp_path, text, "router.workers")


def test_router_workers_ports_claimed(tmp_path: Path) -> None:
    text = ROUTER + "port = 9000\nworkers = 2\nworker_ports = [9001, 9000]\n" + ENGINE_A
    assert "port clash" in error(tmp_path, text, "router.worker_ports[1]")


@pytest.mark.parametrize("extra, key", [
    ('api_key_env = "1BAD"\n', "engines.a.api_key_env"),
])
def test_engine_api_key_only_by_its_key(tmp_path: Path, extra: str, key: str) -> None:
    error(tmp_path, ROUTER + ENGINE_A + extra, key)


# ---------------------------------------------------------------- stock vLLM engines

STOCK = ('[[engines]]\nname = "s"\nkind = "vllm"\nmodel = "builtin:tiny-a"\n'
         'url = "http://127.0.0.1:9000"\n')


def test_a_remote_stock_engine_needs_no_telemetry(tmp_path: Path) -> None:
    (inst,) = load(tmp_path, ROUTER + STOCK).instances()
    assert (inst.kind, inst.telemetry_endpoint, inst.kv_events_endpoint) == ("vllm", None, None)
    assert inst.priority_wire == "none"  # vLLM's default scheduler, FCFS, ignores priorities
    (inst,) = load(tmp_path, ROUTER + STOCK + 'sched_policy = "priority"\n'
                   'kv_events_endpoint = "ipc:///tmp/s.kv"\n').instances()
    assert inst.priority_wire == "stock" and inst.kv_events_endpoint == "ipc:///tmp/s.kv"


def test_patched_engines_take_priorities_unless_fcfs(tmp_path: Path) -> None:
    cfg = load(tmp_path, ROUTER + ENGINE_A + ENGINE_B + 'sched_policy = "fcfs"\n')
    assert [e.priority_wire for e in cfg.engines] == ["hetserve", "none"]


@pytest.mark.parametrize("line, key, problem", [
    ('sched_policy = "stjf"', "sched_policy", "stock vLLM schedules fcfs or priority"),
    ("quantum = 4", "quantum", "not allowed for a remote engine"),
    ('telemetry_endpoint = "ipc:///tmp/t"', "telemetry_endpoint", "engine patch"),
    ('kind = "sglang"', "kind", "one of hetserve, vllm"),
])
def test_stock_engine_refuses_patch_settings(tmp_path: Path, line: str, key: str,
                                             problem: str) -> None:
    text = ROUTER + STOCK.replace('kind = "vllm"\n', "" if "kind" in line else 'kind = "vllm"\n')
    assert problem in error(tmp_path, text + line + "\n", f"engines.s.{key}")


def test_a_local_stock_engine_refuses_patch_settings(tmp_path: Path) -> None:
    text = ROUTER + ENGINE_A + 'kind = "vllm"\nstarvation_threshold = 8\n'
    assert "engine patch" in error(tmp_path, text, "engines.a.starvation_threshold")


def test_stock_kv_events_cannot_reach_a_router_with_keys(tmp_path: Path) -> None:
    text = ROUTER + KEYS + STOCK + 'kv_events_endpoint = "ipc:///tmp/s.kv"\n'
    assert "without CURVE keys" in error(tmp_path, text, "engines.s.kv_events_endpoint")
    assert load(tmp_path, ROUTER + KEYS + STOCK).engines[0].kind == "vllm"
