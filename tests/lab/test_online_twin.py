"""The ``online`` policy in the twin (issue 59): the replay's client tells each attempt's
outcome when the attempt ends, the twin credits it to the policy's book (what ``POST
/v1/hetserve/outcomes`` does live), once per attempt, never before the workflow's last
call; under another policy nothing is reported. Real front, core and policy on the
virtual clock, engine twins on the replay profiles."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernels_bench.lab.replay.client import AgenticClient, ClientSettings
from kernels_bench.lab.replay.workload import Job
from kernels_bench.lab.twin.router import TwinRouter
from kernels_bench.lab.twin.run import outcome_reporter
from router.trace_format import Trace
from tests.lab.twin_helpers import replay_cluster, write_replay_profiles
from tests.replay_fixture import tiny_trace


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Trace:
    return tiny_trace(tmp_path_factory.mktemp("trace"), problems=6)


def run(trace: Trace, profiles: Path, policy: str, attempts: int
        ) -> tuple[TwinRouter, AgenticClient, list[tuple[str, int, float]]]:
    _, loop, router = replay_cluster(profiles, policy)
    client = AgenticClient(ClientSettings({"tiny-a": "small", "tiny-b": "large"},
                                          max_attempts=attempts), router.send, loop.time)
    told: list[tuple[str, int, float]] = []
    report = outcome_reporter(router)

    def tell(pid: str, correct: bool) -> None:
        book = getattr(router.core.routing.policy, "book", None)
        told.append((pid, -1 if book is None else book.counts["accepted"], loop.time()))
        report(pid, correct)

    client.on_outcome = tell
    jobs = [Job(f"w{i}", r, 0.2 * i) for i, r in enumerate(trace.runs)]
    try:
        async def go() -> None:
            await router.start()
            await client.run(jobs)
            await router.stop()
        loop.run_until_complete(go())
    finally:
        loop.close()
    return router, client, told


def test_each_attempt_is_credited_once_when_it_ends(trace: Trace, tmp_path: Path) -> None:
    router, client, told = run(trace, write_replay_profiles(tmp_path), "online", attempts=2)
    book = router.core.routing.policy.book  # type: ignore[union-attr]
    attempts = sum(w.attempts for w in client.workflows)
    assert len(told) == attempts > len(client.workflows)  # some workflows were retried
    assert [n for _, n, _ in told] == list(range(attempts))  # one credit per report
    assert book.counts["accepted"] == attempts
    assert book.counts["duplicate"] == book.counts["unknown"] == 0
    assert book.counts["retry_failure"] >= attempts - len(client.workflows)
    last_call = {}
    for r in client.requests:
        last_call[r.program_id] = max(last_call.get(r.program_id, 0.0), r.end_s)
    assert all(t >= last_call[pid] for pid, _, t in told)  # never before its end


def test_a_policy_that_does_not_learn_is_told_nothing(trace: Trace, tmp_path: Path) -> None:
    router, client, told = run(trace, write_replay_profiles(tmp_path), "round_robin", 1)
    assert len(told) == len(client.workflows) and {n for _, n, _ in told} == {-1}
    assert getattr(router.core.routing.policy, "book", None) is None
