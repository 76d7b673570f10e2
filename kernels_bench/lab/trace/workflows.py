"""The agentic workflows of Chimera's appendix A.1 and their role prompts.

Math: Planner -> Solver -> Verifier -> Solver, Planner -> Solver, Solver.
Code: Planner -> Coder -> QA agent -> Coder, Planner -> Coder, Coder.

Every stage is one chat call, as a ReAct-style agent makes it: the role's system prompt,
then one user turn with the problem and the accumulated history (each earlier stage's
output under its role's name). The prompts are ours, written after the paper's role
descriptions; ``PROMPT_VERSION`` changes whenever their text does.
"""

from __future__ import annotations

import hashlib
import json

from router.trace_format import Message

WORKFLOWS: dict[str, dict[str, list[str]]] = {
    "math": {
        "plan_solve_verify_solve": ["planner", "solver", "verifier", "solver"],
        "plan_solve": ["planner", "solver"],
        "solve": ["solver"],
    },
    "code": {
        "plan_code_qa_code": ["planner", "coder", "qa", "coder"],
        "plan_code": ["planner", "coder"],
        "code": ["coder"],
    },
}

ROLE_NAMES = {"planner": "Planner", "solver": "Solver", "verifier": "Verifier",
              "coder": "Coder", "qa": "QA agent"}

ROLE_PROMPTS: dict[str, dict[str, str]] = {
    "math": {
        "planner": (
            "You are the Planner in a team of agents that solves math word problems. Read "
            "the problem and write a short numbered plan (at most 5 steps) that the Solver "
            "can follow. Do not carry out the calculations and do not give the answer."),
        "solver": (
            "You are the Solver in a team of agents that solves math word problems. Solve "
            "the problem step by step: first explain your reasoning and show every "
            "calculation, then give the final answer on a last line of the form `Answer: "
            "<number>`. Follow the Planner's plan if there is one, and fix every mistake the "
            "Verifier pointed out if there is feedback."),
        "verifier": (
            "You are the Verifier in a team of agents that solves math word problems. Check "
            "the Solver's solution step by step for mistakes in reasoning and arithmetic. "
            "Say whether the solution is correct; if it is not, explain each mistake and how "
            "to fix it. Do not write a complete new solution."),
    },
    "code": {
        "planner": (
            "You are the Planner in a team of agents that writes Python functions. Read the "
            "task and write a short numbered plan (at most 5 steps) for the implementation, "
            "including the edge cases to handle. Do not write code."),
        "coder": (
            "You are the Coder in a team of agents that writes Python functions. Write a "
            "complete and correct implementation of the requested function. Follow the "
            "Planner's plan if there is one, and fix every problem the QA agent reported if "
            "there is a review. Reply with a single ```python code block holding the whole "
            "function and the imports it needs; no tests, no example usage."),
        "qa": (
            "You are the QA agent in a team of agents that writes Python functions. Review "
            "the Coder's implementation against the task: look for bugs, unhandled edge "
            "cases and wrong results on the examples of the docstring. List the problems "
            "you find, or say that the code is correct. Do not rewrite the whole function."),
    },
}

PROBLEM_LABELS = {"math": "Problem", "code": "Task"}
TURN_HINTS = {"solver": " Reason step by step before you answer."}
"""Appended to the user turn of a role: without it the small models often answer at once."""


def prompt_version() -> str:
    """A digest of every prompt and workflow: recorded in a trace's header."""
    blob = json.dumps([WORKFLOWS, ROLE_PROMPTS, ROLE_NAMES, PROBLEM_LABELS, TURN_HINTS, _LAYOUT],
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


_LAYOUT = ("{label}:\n{problem}", "\n\nWork so far:\n", "### {role}\n{text}",
           "\n\nYour turn as the {role}.")


def stage_messages(suite: str, role: str, problem: str,
                   history: list[tuple[str, str]]) -> list[Message]:
    """The messages of one stage: ``history`` is ``(role, output)`` of earlier stages."""
    head, work, item, turn = _LAYOUT
    user = head.format(label=PROBLEM_LABELS[suite], problem=problem.strip())
    if history:
        user += work + "\n\n".join(item.format(role=ROLE_NAMES[r], text=t.strip())
                                   for r, t in history)
    user += turn.format(role=ROLE_NAMES[role]) + TURN_HINTS.get(role, "")
    return [Message("system", ROLE_PROMPTS[suite][role]), Message("user", user)]
