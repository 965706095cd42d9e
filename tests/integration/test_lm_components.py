"""The model-backed components in a real step on the tiny model, registered by name: SGPO with an LMJudge (the
shipped tiny model as judge) against the rule-based `arithmetic_prefix`, and DaGRPO with an
EmbeddingSimilarityScorer (the tiny model's hidden states) against the rule-based `token_jaccard`. On the same
batch the model-backed component scores differently, the advantages are the variant's on its scores, and the
gradient differs from the built-in's."""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step
from tests.integration.test_allneg_aifeedback import gated_verifier
from tests.integration.test_dagrpo import row_parity_verifier
from trl_groupx.advantages.allneg_aifeedback import allneg_aifeedback_advantages, register_allneg_judge
from trl_groupx.advantages.dagrpo import dagrpo_advantages, register_dagrpo_scorer, token_jaccard_similarity
from trl_groupx.advantages.lm_components import EmbeddingSimilarityScorer, LMJudge
from trl_groupx.rewards.arithmetic_prm import arithmetic_prefix_prm
from trl_groupx.toy import load_tiny_model, load_tiny_tokenizer

G = 4  # conftest: num_generations 4, per_device_train_batch_size 8 -> 2 groups


class RecordingJudge(LMJudge):
    """An LMJudge that keeps what it was called with and what it returned."""

    def __call__(self, prompts, completions, **columns):
        scores = super().__call__(prompts, completions, **columns)
        self.calls.append((list(prompts), list(completions), columns.get("answer"), scores))
        return scores


class RecordingScorer(EmbeddingSimilarityScorer):
    def __call__(self, completions, completion_ids, **kwargs):
        sim = super().__call__(completions, completion_ids, **kwargs)
        self.calls.append((list(completions), [list(c) for c in completion_ids], sim))
        return sim


@pytest.fixture
def lm_judge():
    judge = RecordingJudge(load_tiny_model(), load_tiny_tokenizer(), template="{prompt}{completion}",
                           yes_token="1", no_token="0")
    judge.calls = []
    register_allneg_judge("tiny_lm_judge_test", judge)
    return judge


@pytest.fixture
def embedding_scorer():
    scorer = RecordingScorer(load_tiny_model(), load_tiny_tokenizer())
    scorer.calls = []
    register_dagrpo_scorer("tiny_embedding_test", scorer)
    return scorer


def _judged(tmp_path, judge_name, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, reward_funcs=[gated_verifier],
                         advantage_estimator="allneg_aifeedback", allneg_aifeedback_judge=judge_name, **flags)


def test_lm_judge_step_differs_from_rule_based_judge(tmp_path, lm_judge):
    _, rule_grads, rule_inputs = one_step(_judged(tmp_path / "rule", "arithmetic_prefix"))
    trainer = _judged(tmp_path / "lm", "tiny_lm_judge_test")
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], rule_inputs["completion_ids"])  # same batch
    rewards = trainer._rewards_per_func[:, 0]
    all_neg = rewards.view(-1, G).amax(1) == 0
    assert all_neg.any() and not all_neg.all(), rewards
    [(prompts, completions, answers, lm_scores)] = lm_judge.calls  # one call, the all-negative groups' rows
    rows = all_neg.repeat_interleave(G)
    assert [c[0]["content"] for c in completions] == [gated_verifier.texts[i] for i in rows.nonzero().flatten()]
    # the recorded scores are the judge's P("1")/(P("1")+P("0")), recomputed here one row at a time
    again = [lm_judge([p], [c])[0] for p, c in zip(prompts, completions, strict=True)]
    torch.testing.assert_close(torch.tensor(lm_scores), torch.tensor(again), rtol=0, atol=1e-6)
    rule_scores = arithmetic_prefix_prm(prompts=prompts, completions=completions, answer=answers)

    def advantages(scores):
        judged = torch.full_like(rewards, float("nan"))
        judged[rows] = torch.tensor(scores, dtype=judged.dtype)
        return allneg_aifeedback_advantages(rewards, G, judge_scores=judged)

    expected, rule_expected = advantages(lm_scores), advantages(rule_scores)
    torch.testing.assert_close(inputs["advantages"].sort().values, expected.sort().values)  # TRL shuffles rows
    torch.testing.assert_close(rule_inputs["advantages"].sort().values, rule_expected.sort().values)
    assert not torch.allclose(expected, rule_expected, atol=1e-3)  # the two judges disagree on this batch
    assert expected.view(-1, G)[all_neg].abs().sum() > 0
    assert grads_differ(rule_grads, grads)


def _scored(tmp_path, scorer_name, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, reward_funcs=[row_parity_verifier],
                         advantage_estimator="dagrpo", dagrpo_scorer=scorer_name, **flags)


def test_embedding_scorer_step_differs_from_token_jaccard(tmp_path, embedding_scorer):
    _, rule_grads, rule_inputs = one_step(_scored(tmp_path / "rule", "token_jaccard"))
    trainer = _scored(tmp_path / "emb", "tiny_embedding_test")
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], rule_inputs["completion_ids"])  # same batch
    assert len(embedding_scorer.calls) == 2  # one call per group
    rewards = trainer._rewards_per_func[:, 0]

    def advantages(matrices):
        sim = torch.tensor([[[float("nan") if v is None else v for v in r] for r in m] for m in matrices])
        return dagrpo_advantages(rewards, G, pair_similarity=sim)

    emb_sim = [sim for _, _, sim in embedding_scorer.calls]
    # the recorded matrices are the scorer's, recomputed here from the group's texts
    tok = load_tiny_tokenizer()
    for texts, ids, sim in embedding_scorer.calls:
        assert texts == tok.batch_decode(ids, skip_special_tokens=True)
        again = EmbeddingSimilarityScorer(embedding_scorer.model, tok)(texts, ids)
        torch.testing.assert_close(torch.tensor(sim), torch.tensor(again), rtol=0, atol=1e-6)
    rule_sim = [token_jaccard_similarity(texts, ids) for texts, ids, _ in embedding_scorer.calls]
    (expected, keep), (rule_expected, rule_keep) = advantages(emb_sim), advantages(rule_sim)
    torch.testing.assert_close(inputs["advantages"].sort().values, expected.float().sort().values)
    torch.testing.assert_close(rule_inputs["advantages"].sort().values, rule_expected.float().sort().values)
    assert keep.sum() != rule_keep.sum(), (emb_sim, rule_sim)  # the scorers mask different rows on this batch
    assert (inputs["completion_mask"].sum(-1) == 0).sum() == (~keep).sum()  # masked rows have no loss tokens
    assert grads_differ(rule_grads, grads)
