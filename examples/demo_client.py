"""Run one multi-stage workflow (planner -> solver -> verifier) through the hetserve router.

    python examples/demo_client.py --base-url http://127.0.0.1:8100/v1

(``python -m launcher examples/demo.toml --demo`` starts the demo cluster and runs this.)
Each stage is one chat completion with ``model="auto"`` and the workflow metadata in the
body; the router picks model and engine and says which in the response headers
``x-hetserve-model`` and ``x-hetserve-engine``, printed here per stage. The built-in demo
models have random weights, so their text is noise: what matters is the routing.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid

import openai

PROBLEM = ("A baker sells 17 loaves in the morning and twice as many in the afternoon. "
           "Each loaf costs 3 dollars. How much money does the baker take in that day?")
STAGES = (
    ("planner", "Break the problem into short numbered steps. Do not solve it."),
    ("solver", "Follow the plan and compute the answer. End with 'Answer: <number>'."),
    ("verifier", "Check the solution step by step. Reply 'correct' or 'wrong: <why>'."),
)
CONTEXT_CHARS = 600
"""How much of each earlier stage's answer the next stage sees."""


def run_workflow(client: openai.OpenAI, max_tokens: int) -> None:
    program_id = f"demo-{uuid.uuid4().hex[:8]}"
    print(f"workflow 'math', program {program_id}: {len(STAGES)} stages through the router")
    context = f"Problem: {PROBLEM}"
    for i, (stage, instruction) in enumerate(STAGES):
        t0 = time.perf_counter()
        raw = client.chat.completions.with_raw_response.create(
            model="auto",
            messages=[{"role": "system", "content": instruction},
                      {"role": "user", "content": context}],
            max_tokens=max_tokens,
            temperature=0,
            extra_body={"workflow": {"program_id": program_id, "workflow": "math",
                                     "stage": stage, "stage_index": i,
                                     "num_stages": len(STAGES)}},
        )
        completion = raw.parse()
        ms = (time.perf_counter() - t0) * 1e3
        text = completion.choices[0].message.content or ""
        tokens = completion.usage.completion_tokens if completion.usage else "?"
        print(f"  stage {i + 1}/{len(STAGES)} {stage:<9} "
              f"model {raw.headers.get('x-hetserve-model', '?'):<8} "
              f"engine {raw.headers.get('x-hetserve-engine', '?'):<10} "
              f"{ms:6.0f} ms  {tokens} tokens  {text[:40]!r}")
        context += f"\n\n{stage.capitalize()}: {text[:CONTEXT_CHARS]}"
    print("workflow done")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8100/v1",
                   help="the router's OpenAI API base URL")
    p.add_argument("--max-tokens", type=int, default=48)
    args = p.parse_args(argv)
    client = openai.OpenAI(base_url=args.base_url, api_key="hetserve", max_retries=0)
    try:
        run_workflow(client, args.max_tokens)
    except openai.OpenAIError as e:
        print(f"demo client: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
