"""Workflows of Chimera's appendix A.1 and the messages of each stage."""

from __future__ import annotations

from kernels_bench.lab.trace.workflows import WORKFLOWS, prompt_version, stage_messages


def test_workflows_match_the_paper() -> None:
    assert WORKFLOWS["math"] == {
        "plan_solve_verify_solve": ["planner", "solver", "verifier", "solver"],
        "plan_solve": ["planner", "solver"], "solve": ["solver"]}
    assert WORKFLOWS["code"] == {
        "plan_code_qa_code": ["planner", "coder", "qa", "coder"],
        "plan_code": ["planner", "coder"], "code": ["coder"]}


def test_stage_messages_carry_role_prompt_problem_and_history() -> None:
    first = stage_messages("math", "solver", "What is 2+2?", [])
    assert [m.role for m in first] == ["system", "user"]
    assert "Solver" in first[0].content and "Answer: <number>" in first[0].content
    assert first[1].content == ("Problem:\nWhat is 2+2?\n\nYour turn as the Solver. Reason step "
                                "by step before you answer.")
    later = stage_messages("math", "solver", "What is 2+2?",
                           [("planner", "1. add"), ("solver", "4"), ("verifier", "wrong")])
    user = later[1].content
    assert user.index("### Planner\n1. add") < user.index("### Solver\n4") \
        < user.index("### Verifier\nwrong") < user.index("Your turn as the Solver.")
    qa = stage_messages("code", "qa", "def f(): ...", [("coder", "```python\n```")])
    assert qa[1].content.startswith("Task:\n") and "QA agent" in qa[0].content


def test_prompt_version_is_stable() -> None:
    assert prompt_version() == prompt_version() and len(prompt_version()) == 12
