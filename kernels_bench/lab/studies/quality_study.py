"""Quality predictors judged as routers, cross-fitted (issue 30 items 1, 3 and 4).

    python -m kernels_bench.lab.studies.quality_study [--repeats 3] [--boot 1000]
        [--trace FILE ...] [--out DIR]
    python -m kernels_bench.lab.studies.quality_study --confirm data/traces/math-new.jsonl.gz

Rows: the first stage of every (problem, workflow) of the shipped math and code traces
(``--trace``), labelled by whether the 0.5B and the 1.5B Qwen run of that workflow was
right: P(correct), the share of right sampled runs, where the trace has samples of it
(docs/research/traces.md), else the greedy run's 1 / 0. Candidates train on these labels and the
routing metric scores every choice (predicted, random, oracle) on them. Every
number is on held-out problems: the five folds of the artifacts (``Split.fold(0, k, 5)``)
each train on four fifths of the problems and predict the fifth; the held-out predictions
of the five folds are pooled and judged by ``routing_gain_report`` (score against share of
calls on the 1.5B, APGR, bootstrap over problems).

- **Candidates**: each candidate's settings (its small grid) and the choice among the
  candidates are made by an inner 4-fold split of each fold's training problems only
  (validation APGR); the held-out numbers of every candidate are reported beside the
  selected one, losers included.
- **Signals the workflow produces**: on math, the small model's final answer agreeing
  with its answers to the same problem under the other workflows (self-consistency; it
  costs those runs), two sampled runs of the same workflow agreeing (where the trace has
  two samples of the small model and any of the big one; it costs a second run), and its
  verifier calling its answer wrong, and, where ``--programs`` holds them, its final
  answer differing from what its own program for the problem returns (one more call of
  the small model; ties broken by the workflows' disagreement in a second rule); on both,
  the length of its planner's plan; on code,
  the small model's final program failing the examples its own prompt states (doctests,
  run in the sandbox; the hidden tests are not read); on both, where ``--confidence``
  holds them, the small model's token log-probabilities of its final stage
  (``CONFIDENCE_STATS``; on code also as the tie-break of the examples where the prompt
  states none). Each is used as the gain score of an escalation rule (doubt -> the big
  model); no training, so every problem is held out, except a continuous doubt's
  threshold, chosen on each fold's training problems (``thresholded``). They are read
  after the small model's run (the plan after its first stage, the problem text's
  log-probability before it), so an escalated workflow pays for both runs.
- **Noise ceiling** (``ceiling``): where ``--sampled`` traces hold two sampled runs of
  each model, their P(correct) as the prediction of the greedy outcome: about what knowing
  each row's true gain would score on the labels the candidates are judged on.
- **Template ceiling** (``template_ceiling``): on math, each row's gain predicted by the
  mean gain of the other problems of its GSM-symbolic template: what recognising the
  template, with m other problems of it known, is worth; and the share of rows where only
  the small model is right.
- **Learning curve**: the candidates trained on 25%, 50%, 75% and 100% of each fold's
  training problems (seeded subsets, ``--repeats`` draws below 100%), judged on the same
  held-out problems.
- **By suite and template** (``by_suite``): each candidate's held-out report on the math
  and the code rows, the math rows split by whether a training problem of their fold
  instantiates the same GSM-symbolic template, and how the gain of two problems of one
  template correlates.
- **Confirmation** (``--confirm FILE``, docs/research/predictors/quality/confirm-plan.md): the
  predictors ``CONFIRM`` fixed there, trained once on every row of ``--trace`` and
  reported on FILE's problems (none of them in ``--trace``), into ``confirm.json``.

Writes ``study.json``, ``learning-curve.png`` and ``signals.png`` (each signal's share of
the oracle's gain recovered at each share) in ``--out`` (docs/research/predictors/quality/);
``--signals-only`` recomputes only the signals and the ceiling into an existing
``study.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.decomposition import PCA
from tqdm import tqdm
from xgboost import XGBClassifier

from kernels_bench.lab.trace.suites import (code_problem, math_template, passes_examples,
                                            program_agrees)
from router.predictors.encoder import MINILM, Encoder, StaticEncoder, resolve_encoder
from router.predictors.evaluation import problem_resamples, routing_gain_report
from router.predictors.features import RequestFeatures
from router.predictors.knn import (KnnEstimator, KnnSettings, neighbour_weights,
                                  prompt_text)
from router.predictors.lexical import LEXICAL
from router.predictors.metrics import apgr
from router.predictors.records import Split, seeded_uniform
from router.predictors.semantic import SemanticRouter, SemanticSettings
from router.predictors.sources import load_records, parse_model_map, serve_as
from router.predictors.table import PromptTable, prompt_table
from router.trace_format import ModelRun, load_trace

TRACES = ["data/traces/math.jsonl.gz", "data/traces/code.jsonl.gz"]
SAMPLED = ["data/traces/math-sampled.jsonl.gz", "data/traces/code-sampled.jsonl.gz"]
"""Traces with sampled runs (docs/research/traces.md): the noise ceiling's rows (``ceiling``)."""
MODEL_MAP = "tiny-a=qwen2.5-coder-0.5b-instruct,tiny-b=qwen2.5-coder-1.5b-instruct"
SMALL, BIG = "tiny-a", "tiny-b"
TRACE_MATH = ("plan_solve_verify_solve", "plan_solve", "solve")
"""The math suite's workflows (docs/research/traces.md)."""
TRACE_CODE = ("plan_code_qa_code", "plan_code", "code")
"""The code suite's workflows."""
FOLDS = 5
INNER = 4
FRACTIONS = (0.25, 0.5, 0.75, 1.0)
CONFIDENCE = Path("docs/research/predictors/quality/confidence.json")
"""Where ``kernels_bench/lab/studies/small_confidence.py`` writes by default."""
PROGRAMS = Path("docs/research/predictors/quality/programs.json")
"""Where ``kernels_bench/lab/studies/program_check.py`` writes by default."""


@dataclass(frozen=True)
class Data:
    """The rows: labels (n, 2) [small, big] (P(correct) where sampled), the greedy runs'
    outcomes, problems, workflows, texts, features."""

    labels: np.ndarray
    correct: np.ndarray
    problems: np.ndarray
    workflows: np.ndarray
    texts: list[str]
    features: dict[str, np.ndarray]
    table_rows: list[RequestFeatures]
    """The rows as the semantic router reads them."""


Fit = Callable[[Data, np.ndarray, np.ndarray], np.ndarray]
"""(data, training rows, rows to predict) -> predicted gain q_big - q_small per row."""


def difficulty(text: str) -> list[float]:
    """Text-only difficulty proxies: length, numbers and their size, sentences, code lines."""
    nums = re.findall(r"\d+(?:\.\d+)?", text)
    return [np.log1p(len(text)), len(nums), max((len(n) for n in nums), default=0),
            text.count(".") + text.count("?"), text.count("\n"), len(set(text.split()))]


def load(traces: Sequence[str], progress: bool, workflow: str | None = None) -> Data:
    """The rows of ``traces`` (only ``workflow``'s where given), embedded."""
    records = serve_as(load_records(traces), parse_model_map([MODEL_MAP]))
    table = prompt_table(records, [SMALL, BIG], True)
    keep = ~np.isnan(table.label).any(axis=1)
    if workflow is not None:
        keep &= np.array([f.workflow == workflow for f in table.features])
        if not keep.any():
            raise SystemExit(f"--workflow {workflow}: no row of the traces has it")
    feats = [f for f, k in zip(table.features, keep) if k]
    texts = [f.user_text for f in feats]
    workflows = np.array([f.workflow for f in feats])
    names = sorted(set(workflows))
    onehot = (workflows[:, None] == np.array(names)[None]).astype(np.float32)
    t0 = time.monotonic()
    static = static_encoder().embed(texts)
    prompts = static_encoder().embed([prompt_text(f) for f in feats])
    minilm = Encoder(resolve_encoder(MINILM)).embed(texts, progress=progress)
    if progress:
        print(f"embeddings: {time.monotonic() - t0:.0f} s", flush=True)
    diff = np.array([difficulty(t) for t in texts], np.float32)
    diff = (diff - diff.mean(0)) / np.maximum(diff.std(0), 1e-9)
    return Data(table.label[keep], table.correct[keep],
                np.array([p for p, k in zip(table.problems, keep) if k]),
                workflows, texts,
                {"workflow": onehot, "static": static, "minilm": minilm, "difficulty": diff,
                 "prompt": prompts},
                feats)


@functools.cache
def static_encoder() -> StaticEncoder:
    """MiniLM distilled to a static table (the router's default encoder), once."""
    return StaticEncoder.distill(resolve_encoder(MINILM))


def columns(d: Data, *names: str) -> np.ndarray:
    return np.hstack([d.features[n] for n in names])


# ---- candidates: each returns the predicted gain q_big - q_small ----

def prior(d: Data, tr: np.ndarray, te: np.ndarray) -> np.ndarray:
    """P(correct) per (model, workflow): the training base rates (no text)."""
    out = np.zeros(len(te))
    for w in set(d.workflows[te]):
        mine = tr[d.workflows[tr] == w]
        rate = d.labels[mine].mean(0) if len(mine) else d.labels[tr].mean(0)
        out[d.workflows[te] == w] = rate[1] - rate[0]
    return out


def logistic(feature_names: Sequence[str], c: float) -> Fit:
    """One L2 logistic regression of P(correct) per model on the named features."""
    def fit(d: Data, tr: np.ndarray, te: np.ndarray) -> np.ndarray:
        x = columns(d, *feature_names)
        q = [LogisticRegression(C=c, max_iter=2000).fit(x[tr], d.labels[tr, j])
             .predict_proba(x[te])[:, 1] for j in (0, 1)]
        return q[1] - q[0]
    return fit


def ridge_gain(feature_names: Sequence[str], alpha: float) -> Fit:
    """Ridge regression of the gain y_big - y_small itself."""
    def fit(d: Data, tr: np.ndarray, te: np.ndarray) -> np.ndarray:
        x = columns(d, *feature_names)
        y = d.labels[tr, 1] - d.labels[tr, 0]
        return Ridge(alpha=alpha).fit(x[tr], y).predict(x[te])
    return fit


def knn(feature: str, k: int, temperature: float | None = None) -> Fit:
    """The gain of the k most similar training prompts of the same workflow: their mean,
    or with ``temperature`` T each weighted by exp((s - s_max) / T) (s: the cosine
    similarity of the embeddings; ``knn.neighbour_weights``), so that the nearest counts
    most (on math, a problem of the same template: docs/research/predictors.md, "Math's
    templates")."""
    def fit(d: Data, tr: np.ndarray, te: np.ndarray) -> np.ndarray:
        e = d.features[feature]
        out = np.zeros(len(te))
        for i, row in enumerate(te):
            pool = tr[d.workflows[tr] == d.workflows[row]]
            pool = pool if len(pool) else tr
            sim = e[pool] @ e[row]
            top = np.argsort(-sim)[:k]
            w = (np.ones(len(top)) if temperature is None else
                 neighbour_weights(sim[top][None], KnnSettings(temperature=temperature))[0])
            out[i] = w @ (d.labels[pool[top], 1] - d.labels[pool[top], 0]) / w.sum()
        return out
    return fit


def boosted(depth: int) -> Fit:
    """Gradient-boosted trees per model on 16 PCA components of MiniLM, the workflow and
    the difficulty proxies."""
    def fit(d: Data, tr: np.ndarray, te: np.ndarray) -> np.ndarray:
        pca = PCA(16, random_state=0).fit(d.features["minilm"][tr])
        x = np.hstack([pca.transform(d.features["minilm"]), columns(d, "workflow",
                                                                       "difficulty")])
        q = [XGBClassifier(n_estimators=100, max_depth=depth, learning_rate=0.05,
                           subsample=0.8, n_jobs=1, random_state=0, verbosity=0)
             .fit(x[tr], d.labels[tr, j]).predict_proba(x[te])[:, 1] for j in (0, 1)]
        return q[1] - q[0]
    return fit


def training_table(d: Data, tr: np.ndarray) -> PromptTable:
    """The rows ``tr`` as a predictor's training table (output lengths unknown: zeros)."""
    return PromptTable([d.table_rows[i] for i in tr], list(d.problems[tr]), [SMALL, BIG],
                       d.correct[tr], np.zeros_like(d.labels[tr]), d.labels[tr])


def knn_gain(est: KnnEstimator, d: Data, te: np.ndarray) -> np.ndarray:
    """``est``'s predicted gain q_big - q_small on the rows ``te``."""
    q = est.predict([d.table_rows[i] for i in te])
    return np.array([r[BIG].quality - r[SMALL].quality for r in q])


def semantic(d: Data, tr: np.ndarray, te: np.ndarray) -> np.ndarray:
    """Today's default: the static MiniLM table fine-tuned under a linear head, on the
    problem text alone (``SemanticRouter``)."""
    router = SemanticRouter.train(training_table(d, tr), SemanticSettings(), progress=False)
    q = router.predict([d.table_rows[i] for i in te])
    return np.array([r[BIG] - r[SMALL] for r in q])


def router_knn(settings: KnnSettings) -> Fit:
    """The router's own KNN estimator (``KnnEstimator``, RouteBalance's: the static table,
    system + user text, the prompts of the same stage role), with ``settings``' k and
    weights: inverse distance (the paper's), exp((s - s_max) / T), or a band."""
    def fit(d: Data, tr: np.ndarray, te: np.ndarray) -> np.ndarray:
        est = KnnEstimator(static_encoder(), d.features["prompt"][tr],
                           [d.table_rows[i].stage for i in tr], d.labels[tr],
                           np.zeros_like(d.labels[tr]), [SMALL, BIG], settings)
        return knn_gain(est, d, te)
    return fit


def lexical_knn(settings: KnnSettings) -> Fit:
    """The router's KNN on the lexical encoder (``knn.encoder = "lexical"``: hashed word
    n-grams, numbers masked), trained as the router's (``KnnEstimator.train``: the inverse
    document frequencies fitted on the training rows' prompts)."""
    def fit(d: Data, tr: np.ndarray, te: np.ndarray) -> np.ndarray:
        return knn_gain(KnnEstimator.train(training_table(d, tr), settings, progress=False),
                        d, te)
    return fit


def blend(w: float, first: Fit, second: Fit) -> Fit:
    """Two candidates' predicted gains averaged, weight ``w`` on ``first``'s."""
    def fit(d: Data, tr: np.ndarray, te: np.ndarray) -> np.ndarray:
        return w * first(d, tr, te) + (1 - w) * second(d, tr, te)
    return fit


BLEND_WEIGHTS = (0.25, 0.5, 0.75)
"""The blend's grid of the weight on the router's KNN (inverse distance, its default)
against the semantic router."""

TEMPERATURES = (0.01, 0.02, 0.05, 0.1)
"""The similarity-weighted k-NN's grid of T (k = 10)."""

BANDS = (0.005, 0.01, 0.02, 0.03, 0.05)
"""The banded KNN's grid of b (``KnnSettings.band``)."""

LEXICAL_KNN = KnnSettings(encoder=LEXICAL, k=20)
"""The lexical KNN's settings but its weights (latency-plan.md, "A lexical KNN")."""

CANDIDATES: dict[str, list[tuple[str, Fit]]] = {
    "prior per (model, workflow)": [("-", prior)],
    "semantic router (default)": [("-", semantic)],
    "logistic, static + workflow": [(f"C={c}", logistic(("static", "workflow"), c))
                                    for c in (0.1, 1.0, 10.0)],
    "logistic, MiniLM + workflow": [(f"C={c}", logistic(("minilm", "workflow"), c))
                                    for c in (0.1, 1.0, 10.0)],
    "ridge gain, MiniLM + workflow": [(f"alpha={a}", ridge_gain(("minilm", "workflow"), a))
                                      for a in (1.0, 10.0, 100.0)],
    "k-NN, MiniLM, same workflow": [(f"k={k}", knn("minilm", k)) for k in (5, 10, 20)],
    "k-NN weighted by similarity, MiniLM, same workflow": [
        (f"T={t}", knn("minilm", 10, t)) for t in TEMPERATURES],
    "k-NN weighted by similarity, static MiniLM, same workflow": [
        (f"T={t}", knn("static", 10, t)) for t in TEMPERATURES],
    "the router's KNN (RouteBalance: static table, system + user text, same stage role)": [
        (f"T={t}" if t else "inverse distance", router_knn(KnnSettings(temperature=t)))
        for t in (0.0, *TEMPERATURES)],
    "the router's KNN, a band (equal weights within b of the nearest)": [
        (f"k={k}, b={b}", router_knn(KnnSettings(k=k, band=b))) for k in (10, 20) for b in BANDS],
    "the router's KNN, lexical (hashed word n-grams, numbers masked), k=20": [
        ("inverse distance", lexical_knn(LEXICAL_KNN)),
        *((f"T={t}", lexical_knn(dataclasses.replace(LEXICAL_KNN, temperature=t)))
          for t in (0.05, 0.1, 0.2)),
        *((f"b={b}", lexical_knn(dataclasses.replace(LEXICAL_KNN, band=b)))
          for b in (0.2, 0.3))],
    "the router's KNN and the semantic router, their gains blended": [
        (f"w={w}", blend(w, router_knn(KnnSettings()), semantic)) for w in BLEND_WEIGHTS],
    "boosted trees, MiniLM PCA + workflow + difficulty": [(f"depth={k}", boosted(k))
                                                          for k in (2, 4)],
    "logistic, difficulty + workflow": [(f"C={c}", logistic(("difficulty", "workflow"), c))
                                        for c in (0.1, 1.0)],
}


CURVE = ("prior per (model, workflow)", "semantic router (default)",
         "k-NN weighted by similarity, MiniLM, same workflow",
         "logistic, MiniLM + workflow", "ridge gain, MiniLM + workflow")
"""The candidates of the learning curve."""


def fold_of(problem: str, seed: int, folds: int) -> int:
    """The fold ``Split.fold(seed, k, folds)`` that holds ``problem`` out."""
    return next(k for k in range(folds) if Split.fold(seed, k, folds).holds_out(problem))


def subset(d: Data, rows: np.ndarray, fraction: float, repeat: int) -> np.ndarray:
    """A seeded ``fraction`` of the problems of ``rows`` (all of them at 1.0)."""
    if fraction >= 1.0:
        return rows
    keep = {p for p in set(d.problems[rows]) if seeded_uniform(p, f"curve{repeat}") < fraction}
    return rows[np.isin(d.problems[rows], list(keep))]


def examples_doubt(outputs: Sequence[str], problems: Sequence[str]) -> np.ndarray:
    """Per code output of the small model: 1 when its program fails the examples its
    prompt states, 0 when it passes them, 0.5 when the prompt states none that run."""
    def check(i: int) -> float:
        problem = code_problem(problems[i])
        ok = None if problem is None else passes_examples(problem, outputs[i])
        return 0.5 if ok is None else float(not ok)

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        return np.array(list(tqdm(pool.map(check, range(len(outputs))), total=len(outputs),
                                  desc="prompt examples")))


def samples_agree(samples: Sequence[ModelRun]) -> float:
    """1.0 when two sampled runs give the same non-empty final answer, else 0.0. As a
    cascade's check (keep either run where they agree, else escalate), the kept run's
    expected outcome is the pair's mean correctness: the row's P(correct) label, so the
    signal is judged on rows with exactly two samples (the build's K = 2)."""
    a, b = ((r.final_answer or "").strip() for r in samples)
    return float(bool(a) and a == b)


def thresholded(doubt: np.ndarray, labels: np.ndarray, problems: Sequence[str]
                ) -> np.ndarray:
    """A continuous doubt as a rule "escalate where doubt > t", cross-fitted: each of the
    ``FOLDS`` folds of problems gets the t (a 5%-step quantile of its training rows'
    doubt) that scores best on its training rows (mean of the big model's label where
    doubt > t, the small model's elsewhere); returns doubt - t (its sign is the rule; the
    margin ranks the rows for APGR)."""
    fold = np.array([fold_of(p, 0, FOLDS) for p in problems])
    out = np.zeros(len(doubt))
    for k in range(FOLDS):
        tr, te = fold != k, fold == k
        ts = np.unique(np.percentile(doubt[tr], np.arange(0, 101, 5)))
        score = [np.where(doubt[tr] > t, labels[tr, 1], labels[tr, 0]).mean() for t in ts]
        out[te] = doubt[te] - ts[int(np.argmax(score))]
    return out


def program_doubt(answers: Sequence[str | None], outputs: Sequence[str]) -> np.ndarray:
    """Per math row: 0 when the small model's final answer equals what its program for the
    problem returns (``kernels_bench/lab/studies/program_check.py``, run in the sandbox), else 1 (no
    number, no program, or another value)."""
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        return np.array([0.0 if ok else 1.0 for ok in tqdm(
            pool.map(program_agrees, outputs, answers), total=len(outputs),
            desc="programs in the sandbox")])


def confidence_doubt(keys: Sequence[tuple[str, str]], confidence: dict, stat: str
                     ) -> np.ndarray:
    """Per row, minus the small model's token log-probability statistic ``stat`` of its
    final stage (``kernels_bench/lab/studies/small_confidence.py``; ``problem``: of the
    problem text alone); NaN where the file has no score."""
    def one(p: str, w: str) -> float:
        if stat == "problem":
            row = confidence["problems"].get(p, {})
            return -row.get("mean", np.nan)
        return -confidence["rows"].get(f"{p}|{w}", {}).get(stat, np.nan)
    return np.array([one(p, w) for p, w in keys])


CONFIDENCE_STATS = {"mean": "mean token log-probability of its final stage",
                    "p10": "10% quantile of its final stage's token log-probabilities",
                    "min": "least likely token of its final stage",
                    "tail": "mean log-probability of its final stage's last 8 tokens",
                    "problem": "mean log-probability of the problem text (read before any run)"}
"""The confidence statistics judged (``confidence_doubt``), fixed before their numbers."""


def workflow_signals(traces: Sequence[str], boot: int,
                     suites: Sequence[str] = ("math", "code"),
                     confidence: dict | None = None, programs: dict | None = None) -> dict:
    """APGR of the escalation signals (see the module docstring), per suite: each reads
    the small model's greedy runs; labels as the candidates' (P(correct) where sampled).
    Scores are [0.5, doubt], so the top-confidence choice keeps the small model exactly
    where the signal says its run is right (doubt 0) and escalates a tie; a continuous
    doubt (the small model's confidence, ``confidence``) is ``thresholded`` first.
    ``programs``: the small model's programs per math problem (``program_doubt``)."""
    small, big = (dict(parse_model_map([MODEL_MAP]))[m] for m in (SMALL, BIG))
    for name, given in (("confidence", confidence), ("programs", programs)):
        if given is not None and given.get("model") != small:
            raise ValueError(f"the {name} file is of {given.get('model')!r}, "
                             f"not the small model {small!r}")
    runs = {(r.problem_id, r.workflow): r for path in traces
            for r in load_trace(path).complete_runs([small, big])}

    def label_of(keys: Sequence[tuple[str, str]]) -> np.ndarray:
        return np.array([[runs[k].p_correct(m) for m in (small, big)] for k in keys])

    def judged(keys: list[tuple[str, str]], doubt: np.ndarray) -> dict:
        scores = np.stack([np.full(len(doubt), 0.5), doubt], 1)
        return routing_gain_report(scores, label_of(keys), [SMALL, BIG],
                                   [p for p, _ in keys], 0, boot)

    def judged_continuous(keys: list[tuple[str, str]], doubt: np.ndarray) -> dict:
        return judged(keys, 0.5 + thresholded(doubt, label_of(keys), [p for p, _ in keys]))

    def planned(keys: list[tuple[str, str]], into: dict) -> None:
        """The small model's planner's output length (issue 30 item 4), where there is one:
        read after the first stage."""
        ok = [k for k in keys if runs[k].models[small].stages[0].role == "planner"]
        if len(ok) > 1:
            n = np.array([runs[k].models[small].stages[0].output_tokens for k in ok], float)
            into["small model's planner's length (workflows with a planner)"] = \
                judged_continuous(ok, n)

    def confident(keys: list[tuple[str, str]], into: dict) -> None:
        """The confidence signals, on the rows the file scored."""
        if confidence is None:
            return
        for stat, name in CONFIDENCE_STATS.items():
            doubt = confidence_doubt(keys, confidence, stat)
            scored = np.isfinite(doubt)
            if stat == "mean":
                into["confidence rows"] = int(scored.sum())
            if scored.sum() > 1:
                into[f"small model's confidence: {name}"] = judged_continuous(
                    [k for k, s in zip(keys, scored) if s], doubt[scored])

    out: dict = {}
    keys = sorted(k for k in runs if k[1] in TRACE_MATH)
    if keys and "math" in suites:
        agree, verdict = [], []
        for p, w in keys:
            mine = (runs[p, w].models[small].final_answer or "").strip()
            others = [(runs[p, v].models[small].final_answer or "").strip()
                      for v in TRACE_MATH if v != w and (p, v) in runs]
            agree.append(np.mean([mine == o for o in others]))
            check = [st.output_text.lower() for st in runs[p, w].models[small].stages
                     if st.role == "verifier"]
            verdict.append(float(bool(check and re.search(r"incorrect|not correct|wrong",
                                                            check[0]))))
        out["math"] = {"rows": len(keys),
                       "disagreement of the small model's workflows":
                           judged(keys, 1 - np.array(agree)),
                       "small model's verifier says wrong": judged(keys, np.array(verdict))}
        sampled = [k for k in keys if len(runs[k].samples.get(small, [])) == 2
                   and runs[k].samples.get(big)]
        if sampled:
            out["math"]["sampled rows"] = len(sampled)
            out["math"]["disagreement of two samples of the small model"] = judged(
                sampled, np.array([1.0 - samples_agree(runs[k].samples[small]) for k in sampled]))
        planned(keys, out["math"])
        confident(keys, out["math"])
        if programs is not None:
            have = [k for k in keys if k[0] in programs["problems"]]
            if have:
                doubt = program_doubt([runs[k].models[small].final_answer for k in have],
                                      [programs["problems"][p]["output_text"] for p, _ in have])
                kept = set(have)
                disagree = 1 - np.array([a for k, a in zip(keys, agree) if k in kept])
                out["math"]["program rows"] = len(have)
                out["math"]["small model's answer differs from its program's"] = judged(
                    have, doubt)
                out["math"]["its program's answer, ties by its workflows' disagreement"] = \
                    judged(have, doubt + 0.4 * disagree)
    keys = sorted(k for k in runs if k[1] in TRACE_CODE)
    if keys and "code" in suites:
        doubt = examples_doubt([runs[k].models[small].stages[-1].output_text for k in keys],
                               [p for p, _ in keys])
        out["code"] = {"rows": len(keys), "doubt": doubt.tolist(),
                       "small model's code fails its prompt's examples": judged(keys, doubt)}
        planned(keys, out["code"])
        confident(keys, out["code"])
        if confidence is not None:
            mean = confidence_doubt(keys, confidence, "mean")
            if np.isfinite(mean).all():
                none = doubt == 0.5
                both = doubt.copy()
                both[none] = 0.5 + thresholded(mean[none], label_of(keys)[none],
                                               [p for (p, _), n in zip(keys, none) if n])
                both[~none] = np.where(doubt[~none] > 0.5, 1e3, -1e3)  # the examples decide
                out["code"]["examples, else the small model's mean token confidence"] = \
                    judged(keys, both)
    return out


def ceiling(traces: Sequence[str], boot: int) -> dict:
    """About what a predictor that knew each row's gain would score against the greedy
    labels every candidate is judged on: per suite, on the rows with exactly two sampled
    runs of each model (drawn independently of the greedy ones), the samples' P(correct)
    as the prediction of the greedy run's outcome (a tie, as always, goes to the big
    model). An estimate, low rather than high: two samples estimate a row's gain with
    noise, and at another temperature than the greedy runs'."""
    small, big = (dict(parse_model_map([MODEL_MAP]))[m] for m in (SMALL, BIG))
    out: dict = {}
    for path in traces:
        if not Path(path).exists():
            continue
        trace = load_trace(path)
        rows = [r for r in trace.complete_runs([small, big])
                if all(len(r.samples.get(m, [])) == 2 for m in (small, big))]
        if len(rows) < 2:
            continue
        greedy = np.array([[r.models[m].correct for m in (small, big)] for r in rows], float)
        sampled = np.array([[r.p_correct(m) for m in (small, big)] for r in rows])
        out[trace.header.suite] = {
            "rows": len(rows), "problems": len({r.problem_id for r in rows}),
            "samples predict the greedy outcome": routing_gain_report(
                sampled, greedy, [SMALL, BIG], [r.problem_id for r in rows], 0, boot)}
    return out


def report(d: Data, gain: np.ndarray, boot: int, rows: np.ndarray | None = None) -> dict:
    """``routing_gain_report`` of the predicted ``gain`` (per row of ``d``) on ``rows``
    (a mask or indices; default all)."""
    rows = np.arange(len(gain)) if rows is None else rows
    scores = np.stack([np.zeros_like(gain[rows]), gain[rows]], 1)
    return routing_gain_report(scores, d.labels[rows], [SMALL, BIG], list(d.problems[rows]),
                               0, boot)


def template_ids(d: Data) -> np.ndarray:
    """Per row: the GSM-symbolic template of its problem (``suites.math_template``), ""
    for a row that is not math."""
    return np.array([math_template(p) or "" for p in d.problems])


def template_seen(tmpl: np.ndarray, fold: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``template_ids``: whether it is a math row, and whether a row of another
    ``fold`` (an id per row) is of a problem instantiating its template."""
    math = tmpl != ""
    seen = np.array([m and bool(((tmpl == t) & (fold != f)).any())
                     for m, t, f in zip(math, tmpl, fold)])
    return math, seen


def template_correlation(d: Data, tmpl: np.ndarray) -> dict[str, float | int | None]:
    """Correlation of the gain y_big - y_small between two math problems' rows of the same
    workflow (``tmpl``: ``template_ids``): of one template, and of two different ones."""
    gain = d.labels[:, 1] - d.labels[:, 0]
    pairs: dict[bool, list[tuple[int, int]]] = {True: [], False: []}
    rows = np.flatnonzero(tmpl != "")
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            if d.workflows[a] == d.workflows[b] and d.problems[a] != d.problems[b]:
                pairs[bool(tmpl[a] == tmpl[b])].append((a, b))
    out: dict[str, float | int | None] = {}
    for same, label in ((True, "same template"), (False, "different templates")):
        a, b = np.array(pairs[same], dtype=int).reshape(-1, 2).T
        spread = len(a) > 1 and gain[a].std() > 0 and gain[b].std() > 0
        out[label] = float(np.corrcoef(gain[a], gain[b])[0, 1]) if spread else None
        out[f"{label}: pairs"] = len(a)
    return out


def by_suite(d: Data, held: dict[str, np.ndarray], fold: np.ndarray, boot: int) -> dict:
    """Each candidate's held-out report on the math rows (all, of a template some training
    problem of the fold instantiates, of one none does) and on the code rows."""
    tmpl = template_ids(d)
    math, seen = template_seen(tmpl, fold)
    masks = {"math": math, "math, template seen in training": seen,
             "math, template not seen": math & ~seen, "code": ~math}
    return {"rows": {k: int(v.sum()) for k, v in masks.items()},
            "gain correlation": template_correlation(d, tmpl),
            "candidates": {name: {k: report(d, g, boot, v) for k, v in masks.items()}
                           for name, g in held.items()}}


CEILING_INSTANCES = (1, 2, 3, 4, 6, 8)
"""How many other problems of a template ``template_ceiling`` averages, at most."""


def template_mean_gain(d: Data, m: int | None, rng: np.random.Generator) -> np.ndarray:
    """Per row: the mean gain y_big - y_small of the other math problems of its template
    and workflow, at most ``m`` of them (drawn by ``rng``; all where None); where it has
    none, that of the other math rows of its workflow. 0 for a row that is not math."""
    tmpl = template_ids(d)
    gain = d.labels[:, 1] - d.labels[:, 0]
    out = np.zeros(len(gain))
    for i in np.flatnonzero(tmpl != ""):
        near = np.flatnonzero((tmpl == tmpl[i]) & (d.workflows == d.workflows[i]))
        near = near[near != i]
        if m is not None and len(near) > m:
            near = rng.choice(near, m, replace=False)
        if not len(near):
            near = np.flatnonzero((tmpl != "") & (d.workflows == d.workflows[i]))
            near = near[near != i]
        out[i] = gain[near].mean() if len(near) else 0.0
    return out


def nearest_same_template(d: Data, feature: str) -> float | None:
    """The share of math rows, among those whose template has another problem under their
    workflow, whose most similar other row of that workflow (cosine of ``feature``) is
    of the same template: how well the embedding recognises the template."""
    tmpl, e = template_ids(d), d.features[feature]
    hits = []
    for i in np.flatnonzero(tmpl != ""):
        pool = np.flatnonzero((tmpl != "") & (d.workflows == d.workflows[i]))
        pool = pool[pool != i]
        if (tmpl[pool] == tmpl[i]).any():
            hits.append(tmpl[pool[np.argmax(e[pool] @ e[i])]] == tmpl[i])
    return float(np.mean(hits)) if hits else None


def template_ceiling(d: Data, boot: int, draws: int = 30) -> dict:
    """What knowing each math problem's template is worth (the k-NN's nearest training
    problem is of the same template on 99-100% of rows: docs/research/predictors.md): the routing
    report of ``template_mean_gain`` over all other problems of each row's template, and
    its mean APGR at most m of them (``CEILING_INSTANCES``, ``draws`` seeded draws each).
    Also the share of math rows where only the small model is right, which bounds what
    any top-confidence choice can gain over always the big one."""
    tmpl = template_ids(d)
    rows = np.flatnonzero(tmpl != "")
    if len(rows) < 2:
        return {}
    rng = np.random.default_rng(0)
    keys = list(zip(tmpl[rows], d.workflows[rows]))
    counts = Counter(keys)
    others = np.array([counts[k] - 1 for k in keys])
    curve = [{"at most": m, "others used": float(np.minimum(others, m).mean()),
              "apgr": float(np.mean([apgr(template_mean_gain(d, m, rng)[rows],
                                          d.labels[rows, 0], d.labels[rows, 1])
                                     for _ in range(draws)]))}
             for m in CEILING_INSTANCES]
    return {"rows": len(rows), "templates": len({t for t, _ in keys}),
            "only small right": float((d.labels[rows, 0] > d.labels[rows, 1]).mean()),
            "nearest of the same template": {f: nearest_same_template(d, f)
                                             for f in ("minilm", "static") if f in d.features},
            "by instances": curve,
            "all others": report(d, template_mean_gain(d, None, rng), boot, rows)}


CONFIRM: dict[str, Fit] = {
    "k-NN weighted by similarity, MiniLM, T=0.02 (primary)": knn("minilm", 10, 0.02),
    "k-NN weighted by similarity, static MiniLM, T=0.01": knn("static", 10, 0.01),
    "semantic router (default)": semantic,
}
"""docs/research/predictors/quality/confirm-plan.md's predictors, as fixed there."""


def confirm(d: Data, new: np.ndarray, boot: int) -> dict:
    """docs/research/predictors/quality/confirm-plan.md: each of ``CONFIRM`` trained on the rows
    outside ``new`` (a mask), reported on the ``new`` rows and, for math rows, on those of
    a template the training rows have and of one they do not; the primary's APGR minus the
    default's, paired bootstrap over problems."""
    tr, te = np.flatnonzero(~new), np.flatnonzero(new)
    gains = {name: np.zeros(len(d.problems)) for name in CONFIRM}
    for name, fit in CONFIRM.items():
        gains[name][te] = fit(d, tr, te)
    math, seen = template_seen(template_ids(d), new.astype(int))
    masks = {"new problems": new}
    if (new & math).any():
        masks |= {"template seen in training": new & seen,
                  "template not seen": new & math & ~seen}
    primary, default = list(CONFIRM)[0], "semantic router (default)"
    ys, yb = d.labels[te, 0], d.labels[te, 1]
    point = apgr(gains[primary][te], ys, yb) - apgr(gains[default][te], ys, yb)
    draws = [apgr(gains[primary][te][idx], ys[idx], yb[idx])
             - apgr(gains[default][te][idx], ys[idx], yb[idx])
             for idx in problem_resamples(d.problems[te], 0, boot)]
    lo, hi = np.percentile(draws, [2.5, 97.5])
    return {"rows": {k: int(v.sum()) for k, v in masks.items()},
            "training rows": len(tr), "training problems": len(set(d.problems[tr])),
            "predictors": {name: {k: report(d, g, boot, v) for k, v in masks.items()}
                           for name, g in gains.items()},
            "primary minus default, APGR": {"value": float(point), "lo": float(lo),
                                            "hi": float(hi)}}


def positive(text: str) -> int:
    """An integer >= 1 (argparse type)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 1 <= value <= 100_000:
        raise argparse.ArgumentTypeError(f"{value} is not in 1..100000")
    return value


def optional_file(flag: str, path: Path, script: str, keys: Sequence[str]) -> dict | None:
    """The JSON object ``scripts/<script>.py`` wrote at ``path``; None when it is absent;
    a one-line exit when it is not such a file."""
    if not path.exists():
        return None
    try:
        out = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"{flag} {path}: {e}") from None
    if not (isinstance(out, dict) and set(keys) <= set(out)):
        raise SystemExit(f"{flag} {path}: not a file of scripts/{script}.py "
                         f"({', '.join(keys)})")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=positive, default=2,
                   help="seeded draws of each fraction below 100%% (default 2)")
    p.add_argument("--only", nargs="+", choices=list(CANDIDATES), default=list(CANDIDATES),
                   help="the candidates to run (default: all)")
    p.add_argument("--boot", type=positive, default=1000,
                   help="bootstrap draws of problems (default 1000)")
    p.add_argument("--trace", nargs="+", default=TRACES,
                   help="trace files (default: the shipped math and code traces)")
    p.add_argument("--out", type=Path, default=Path("docs/research/predictors/quality"))
    p.add_argument("--confidence", type=Path, default=CONFIDENCE,
                   help="the small model's token log-probabilities of its runs "
                        "(kernels_bench.lab.studies.small_confidence; default %(default)s, "
                        "skipped when absent)")
    p.add_argument("--programs", type=Path, default=PROGRAMS,
                   help="the small model's programs per math problem "
                        "(kernels_bench.lab.studies.program_check; default %(default)s, "
                        "skipped when absent)")
    p.add_argument("--sampled", nargs="*", default=SAMPLED,
                   help="traces with two sampled runs per model, for the noise ceiling "
                        "(default: the shipped sampled traces; absent ones skipped)")
    p.add_argument("--signals-only", action="store_true",
                   help="recompute only the workflow signals and the ceiling into --out's "
                        "study.json")
    p.add_argument("--workflow", metavar="NAME",
                   help="only this workflow's rows (as on traces that hold one workflow per "
                        "problem); the workflow signals, which compare workflows, and the "
                        "noise ceiling are then not computed")
    p.add_argument("--confirm", type=Path, metavar="FILE",
                   help="only the confirmation of docs/research/predictors/quality/confirm-plan.md: "
                        "train on --trace, report on FILE's problems (none of --trace's) "
                        "into --out's confirm.json")
    args = p.parse_args()
    if args.confirm:
        run_confirm(args.trace, args.confirm, args.out, args.boot)
        return
    confidence = optional_file("--confidence", args.confidence, "small_confidence",
                               ("model", "rows", "problems"))
    programs = optional_file("--programs", args.programs, "program_check",
                             ("model", "problems"))
    if args.signals_only and args.workflow:
        raise SystemExit("--signals-only compares workflows: not with --workflow")
    if args.signals_only:
        path = args.out / "study.json"
        if not path.exists():
            raise SystemExit(f"--signals-only: {path} does not exist; run the whole study")
        result = json.loads(path.read_text())
        result["workflow_signals"] = workflow_signals(args.trace, args.boot,
                                                      confidence=confidence, programs=programs)
        result["ceiling"] = ceiling(args.sampled, args.boot)
        path.write_text(json.dumps(result, indent=1))
        plot_signals(result["workflow_signals"], args.out / "signals.png")
        print_summary(result)
        return
    d = load(args.trace, progress=True, workflow=args.workflow)
    n = len(d.labels)
    fold = np.array([fold_of(pr, 0, FOLDS) for pr in d.problems])
    result: dict = {"rows": n, "problems": len(set(d.problems)),
                    "base": {"small": float(d.labels[:, 0].mean()),
                             "big": float(d.labels[:, 1].mean()),
                             "oracle": float(d.labels.max(1).mean())},
                    "candidates": {}, "curve": {}}
    candidates = {name: CANDIDATES[name] for name in args.only}
    held: dict[str, np.ndarray] = {name: np.zeros(n) for name in candidates}
    chosen = np.zeros(n)
    picks: list[dict] = []
    for k in range(FOLDS):
        tr, te = np.flatnonzero(fold != k), np.flatnonzero(fold == k)
        inner = np.array([fold_of(pr, 1 + k, INNER) for pr in d.problems[tr]])
        val: dict[str, tuple[float, str, Fit]] = {}
        for name, grid in candidates.items():
            best = None
            for label, fit in grid:
                g = np.zeros(len(tr))
                for j in range(INNER):
                    a, b = tr[inner != j], np.flatnonzero(inner == j)
                    g[b] = fit(d, a, tr[b])
                score = apgr(g, d.labels[tr, 0], d.labels[tr, 1])
                if best is None or score > best[0]:
                    best = (score, label, fit)
            assert best is not None
            val[name] = best
            held[name][te] = best[2](d, tr, te)
            print(f"fold {k} {name} [{best[1]}]: validation APGR {best[0]:.3f}", flush=True)
        winner = max(val, key=lambda m: val[m][0])
        chosen[te] = held[winner][te]
        picks.append({"fold": k, "winner": winner,
                      "validation": {m: {"apgr": v[0], "setting": v[1]}
                                     for m, v in val.items()}})
    result["folds"] = picks
    result["by_suite"] = by_suite(d, {**held, "selected per fold": chosen}, fold, args.boot)
    for name in candidates:
        result["candidates"][name] = report(d, held[name], args.boot)
    result["selected"] = report(d, chosen, args.boot)
    result["template ceiling"] = template_ceiling(d, args.boot)
    for name in [m for m in CURVE if m in candidates]:
        setting = dict(CANDIDATES[name])
        label = max(set(p["validation"][name]["setting"] for p in picks),
                    key=[p["validation"][name]["setting"] for p in picks].count)
        curve = []
        for f in FRACTIONS:
            for r in range(1 if f >= 1.0 else args.repeats):
                g = np.zeros(n)
                for k in range(FOLDS):
                    tr, te = np.flatnonzero(fold != k), np.flatnonzero(fold == k)
                    g[te] = setting[label](d, subset(d, tr, f, r), te)
                rep = report(d, g, args.boot)
                curve.append({"fraction": f, "repeat": r, "apgr": rep["apgr"],
                              "top_minus_big": rep["top_confidence_minus_always_big"]})
                print(f"curve {name} [{label}] {f:.2f} #{r}: APGR "
                      f"{rep['apgr']['value']:.3f}", flush=True)
        result["curve"][name] = {"setting": label, "points": curve}
    if args.workflow is None:
        result["workflow_signals"] = workflow_signals(args.trace, args.boot,
                                                      confidence=confidence, programs=programs)
        result["ceiling"] = ceiling(args.sampled, args.boot)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "study.json").write_text(json.dumps(result, indent=1))
    plot(result, args.out / "learning-curve.png")
    if args.workflow is None:
        plot_signals(result["workflow_signals"], args.out / "signals.png")
    print_summary(result)


def run_confirm(traces: Sequence[str], path: Path, out: Path, boot: int) -> None:
    """``--confirm``: refuse a FILE that is unreadable or shares a problem with ``traces``;
    write ``confirm.json`` and print it."""
    try:
        new_problems = {r.problem_id for r in load_trace(path).runs}
        old = {r.problem_id for t in traces for r in load_trace(t).runs}
    except (OSError, ValueError) as e:
        raise SystemExit(f"--confirm: {e}")
    if not new_problems or new_problems & old:
        raise SystemExit(f"--confirm {path}: it must hold problems and none of --trace's "
                         f"(it shares {len(new_problems & old)}; keep only the new ones with "
                         f"`python -m kernels_bench trace compact GROWN NEW --without OLD`)")
    d = load([*traces, str(path)], progress=True)
    result = confirm(d, np.isin(d.problems, sorted(new_problems)), boot)
    out.mkdir(parents=True, exist_ok=True)
    (out / "confirm.json").write_text(json.dumps(result, indent=1))
    print(f"trained on {result['training problems']} problems; rows {result['rows']}")
    for name, reps in result["predictors"].items():
        for k, rep in ((k, r) for k, r in reps.items() if r):
            a, t = rep["apgr"], rep["top_confidence_minus_always_big"]
            print(f"{name[:52]:52s} {k:26s} APGR {a['value']:+.3f} [{a['lo']:+.3f}, "
                  f"{a['hi']:+.3f}]  top - big {t['value']:+.3f} [{t['lo']:+.3f}, "
                  f"{t['hi']:+.3f}]")
    v = result["primary minus default, APGR"]
    print(f"primary minus default, APGR: {v['value']:+.3f} [{v['lo']:+.3f}, {v['hi']:+.3f}]")


def print_summary(result: dict) -> None:
    def ci(v: dict) -> str:
        return f"{v['value']:+.3f} [{v['lo']:+.3f}, {v['hi']:+.3f}]"
    print(f"\n{'candidate':52s} {'APGR':>26s} {'top - always big':>26s}")
    rows = [*result["candidates"].items(), ("selected per fold", result["selected"]),
            *((f"{suite}: {k}", v)
              for suite, signals in result.get("workflow_signals", {}).items()
              for k, v in signals.items() if isinstance(v, dict)),
            *((f"{suite}: ceiling, {c['rows']} rows", c["samples predict the greedy outcome"])
              for suite, c in result.get("ceiling", {}).items()),
            *((f"math: template ceiling, {c['rows']} rows", c["all others"])
              for c in [result.get("template ceiling")] if c)]
    for name, rep in rows:
        print(f"{name:52s} {ci(rep['apgr']):>26s} "
              f"{ci(rep['top_confidence_minus_always_big']):>26s}")


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, c in result["curve"].items():
        pts = c["points"]
        fr = sorted({p["fraction"] for p in pts})
        mean = [np.mean([p["apgr"]["value"] for p in pts if p["fraction"] == f]) for f in fr]
        lo = [np.mean([p["apgr"]["lo"] for p in pts if p["fraction"] == f]) for f in fr]
        hi = [np.mean([p["apgr"]["hi"] for p in pts if p["fraction"] == f]) for f in fr]
        n = [f * result["problems"] * (FOLDS - 1) / FOLDS for f in fr]
        line, = ax.plot(n, mean, marker="o", label=name)
        ax.fill_between(n, lo, hi, color=line.get_color(), alpha=0.12)
    ax.axhline(0, color="grey", lw=0.8)
    ax.axhline(0.3, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("training problems per fold")
    ax.set_ylabel("held-out APGR (share of oracle gain over random)")
    ax.set_title("Learning curve, cross-fitted over 5 folds")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_signals(signals: dict, path: Path) -> None:
    """Share of the oracle's gain over random recovered at each share of rows escalated to
    the big model, one panel per suite, one line per signal (each on its own rows)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    suites = [s for s in signals if any(isinstance(v, dict) for v in signals[s].values())]
    fig, axes = plt.subplots(1, len(suites), figsize=(6.5 * len(suites), 6.2), squeeze=False)
    for ax, suite in zip(axes[0], suites):
        reps = {k: v for k, v in signals[suite].items() if isinstance(v, dict) and v}
        colors = plt.get_cmap("tab10").colors
        for i, (name, rep) in enumerate(reps.items()):
            short = name.replace("small model's confidence: ", "confidence: ")
            ax.plot([p["share"] for p in rep["per_share"]],
                    [p["recovered"]["value"] for p in rep["per_share"]], marker="o",
                    color=colors[i % len(colors)],
                    label=f"{short[:60]} ({rep['prompts']} rows)")
        ax.axhline(0, color="grey", lw=0.8)
        ax.axhline(0.3, color="grey", lw=0.8, ls="--")
        ax.set_xlabel("share of rows escalated to the big model")
        ax.set_ylabel("share of the oracle's gain over random")
        ax.set_title(f"{suite}: escalation signals (0 random, 1 oracle, dashed: 0.3)")
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.13))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
