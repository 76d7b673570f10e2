"""Semantic router (Chimera 3.3): MiniLM + multi-label head trained with masked BCE on
part of the SYNTHETIC fixture learns each model's skill per task from the prompt text and
beats the per-model base rate on every held-out problem; save and reload.

Test-sized settings (short inputs, a larger learning rate, 3 epochs); the paper's
defaults (5 epochs, lr 1e-5, batch 16) are ``SemanticSettings()``. At lr 1e-3 the
fine-tuned encoder collapses for some seeds (measured with transformers 5.19: two of
three seeds lost the per-task skill); at 1e-4 all three learned it, mAP 0.64-0.65
against the base rate's 0.56."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from router.predictors.semantic import SemanticRouter, SemanticSettings
from router.predictors.table import prompt_table
from tests.fixtures.predictors import check_fixture_skill, request, split

MODELS = ["synthetic-large", "synthetic-small"]


def test_paper_defaults() -> None:
    s = SemanticSettings()
    assert (s.epochs, s.lr, s.batch_size) == (5, 1e-5, 16)
    assert s.encoder == "minilm-static"  # issue 33: the transformer is "minilm"


def test_trains_beats_base_rate_and_reloads(tmp_path: Path) -> None:
    """Trained on 20 problems per task (for time), evaluated on all ~60 held-out ones (of
    the same seeded split, so none was seen): with only the 20-problem subset's ~8
    held-out problems even an ideal task-only score gains about 0.06 mAP over the base
    rate, which a margin on that subset would mostly measure noise."""
    train, test = split(problems=20)[0], split()[1]
    settings = SemanticSettings(encoder="minilm", max_length=64, lr=1e-4, epochs=3)
    model = SemanticRouter.train(prompt_table(train, MODELS, True), settings, progress=False)
    check_fixture_skill(model, test, MODELS)
    model.save(tmp_path, {"seed": 0, "holdout": 0.2})
    again = SemanticRouter.load(tmp_path)
    reqs = [request(r, str(i)) for i, r in enumerate(test[:6])]
    for a, b in zip(asyncio.run(again.confidence(reqs)), asyncio.run(model.confidence(reqs))):
        assert a == pytest.approx(b, abs=1e-5)


def test_encoder_must_be_a_local_folder(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a local Hugging Face model folder"):
        SemanticRouter.train(prompt_table(split(problems=2)[0], MODELS, True),
                             SemanticSettings(encoder=str(tmp_path)), progress=False)


def test_numpy_head_equals_the_torch_head() -> None:
    """``predict`` serves the head through numpy (issue 33: torch's dispatch cost tens of
    microseconds a call): equal to ``sigmoid(head(embedding))`` in torch within float32
    rounding, logits far past the sigmoid's range included."""
    import torch

    from router.predictors.encoder import Encoder, resolve_encoder

    torch.manual_seed(0)
    encoder = Encoder(resolve_encoder("minilm"), max_length=64)
    head = torch.nn.Linear(encoder.dim, 2)
    with torch.no_grad():
        head.bias[1] = -200.0  # model 2: exp(200) overflows float32
    model = SemanticRouter(encoder, head, MODELS, SemanticSettings(encoder="minilm"))
    feats = [request(r, str(i)) for i, r in enumerate(split()[1][:8])]
    with torch.inference_mode():
        want = torch.sigmoid(head(encoder([r.user_text for r in feats]))).numpy()
    got = asyncio.run(model.confidence(feats))
    assert [list(q) for q in got] == [MODELS] * len(feats)
    for row, q in zip(want, got):
        assert [q[m] for m in MODELS] == pytest.approx(row.tolist(), rel=1e-5, abs=1e-7)
    assert all(q[MODELS[1]] == 0.0 for q in got)  # saturated, and no overflow warning
