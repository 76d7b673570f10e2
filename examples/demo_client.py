"""Run multi-stage workflows (planner -> solver -> verifier) through the hetserve router.

    python examples/demo_client.py --base-url http://127.0.0.1:8100/v1 --workflows 3

(``python -m launcher examples/demo.toml --demo`` starts the demo cluster and runs this.)
Each stage is one chat completion with ``model="auto"`` and the workflow metadata in the
body; the router picks model and engine and says which in the response headers
``x-hetserve-model`` and ``x-hetserve-engine``, printed here per stage. Several workflows
run at once (staggered), so the router has load to balance: Chimera keeps each workflow
on one model and sends the next one elsewhere when the preferred model is congested. The
built-in demo models have random weights, so their text is noise: what matters is the
routing.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

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


def run_workflow(client: openai.OpenAI, max_tokens: int,
                 delay_s: float) -> tuple[list[str], list[str]]:
    """One workflow; returns its report lines (printed after all finish) and the model
    that served each stage."""
    time.sleep(delay_s)
    program_id = f"demo-{uuid.uuid4().hex[:8]}"
    lines = [f"workflow 'math', program {program_id}: {len(STAGES)} stages through the router"]
    context = f"Problem: {PROBLEM}"
    models: list[str] = []
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
        models.append(raw.headers.get("x-hetserve-model", "?"))
        lines.append(f"  stage {i + 1}/{len(STAGES)} {stage:<9} model {models[-1]:<8} "
                     f"engine {raw.headers.get('x-hetserve-engine', '?'):<10} "
                     f"{ms:6.0f} ms  {tokens} tokens  {text[:40]!r}")
        context += f"\n\n{stage.capitalize()}: {text[:CONTEXT_CHARS]}"
    return lines, models


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8100/v1",
                   help="the router's OpenAI API base URL")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--workflows", type=int, default=3, help="workflows run concurrently")
    p.add_argument("--stagger-s", type=float, default=0.3,
                   help="delay between the starts of consecutive workflows")
    args = p.parse_args(argv)
    if args.workflows < 1 or args.max_tokens < 1 or args.stagger_s < 0:
        p.error("--workflows and --max-tokens must be >= 1, --stagger-s >= 0")
    client = openai.OpenAI(base_url=args.base_url, api_key="hetserve", max_retries=0)
    try:
        with ThreadPoolExecutor(args.workflows) as pool:
            reports = list(pool.map(lambda i: run_workflow(client, args.max_tokens,
                                                           i * args.stagger_s),
                                    range(args.workflows)))
    except openai.OpenAIError as e:
        print(f"demo client: {e}", file=sys.stderr)
        return 1
    for lines, _ in reports:
        print("\n".join(lines))
    share = Counter(m for _, models in reports for m in models)
    print("stages per model: " + ", ".join(f"{m} {n}" for m, n in sorted(share.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
