"""SGPO all-negative rescue: one real step on the tiny model, full and LoRA. The verifier fails every completion of a
prompt with an even answer (an all-negative group) and mixes within the other groups, so one batch has both: the
judge sees exactly the all-negative groups' completions, the advantages are SGPO's on the trainer's rewards, and
the gradient differs from plain GRPO's (which gets nothing from the all-negative groups). With no all-negative
group the judge is never called and the gradient is GRPO's."""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step
from trl_groupx.advantages.allneg_aifeedback import allneg_aifeedback_advantages, register_allneg_judge


def gated_verifier(completions, answer, **kwargs) -> list[float]:
    """0 on every completion of a prompt whose answer is even, else 1 on odd rows of the batch (a group's rows are
    contiguous, so such a group mixes 0 and 1). Keeps the last batch's completion texts, in row order."""
    gated_verifier.texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [0.0 if int(a) % 2 == 0 else float(i % 2) for i, a in enumerate(answer)]


def row_parity_verifier(completions, **kwargs) -> list[float]:
    """1 on odd rows: every group mixes, none is all-negative."""
    return [float(i % 2) for i in range(len(completions))]


class LengthJudge:
    """Toy judge whose score grows with the completion's length (distinct scores in a group); records its calls."""

    def __init__(self):
        self.seen: list[str] = []

    def __call__(self, prompts, completions, **kwargs):
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        self.seen.extend(texts)
        return [min(1.0, 0.15 * len(t)) for t in texts]


@pytest.fixture
def judge():
    judge = LengthJudge()
    register_allneg_judge("length_test_judge", judge)
    return judge


def sgpo(tmp_path, peft=False, reward=gated_verifier, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, reward_funcs=[reward],
                         **flags)


ON = {"advantage_estimator": "allneg_aifeedback", "allneg_aifeedback_judge": "length_test_judge"}


@pytest.mark.parametrize("peft", [False, True])
def test_rescue_changes_gradient_with_exact_advantages(tmp_path, peft, judge):
    _, base_grads, base_inputs = one_step(sgpo(tmp_path / "base", peft))
    trainer = sgpo(tmp_path / "sgpo", peft, **ON)
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])  # same batch
    rewards = trainer._rewards_per_func[:, 0]
    all_neg = rewards.view(-1, 4).amax(1) == 0
    assert all_neg.any() and not all_neg.all(), rewards  # the fixture gives both kinds of group
    # the judge saw exactly the all-negative groups' completions, decoded as TRL decodes them
    rows = all_neg.repeat_interleave(4).nonzero().flatten().tolist()
    assert judge.seen == [gated_verifier.texts[i] for i in rows]
    scores = torch.full_like(rewards, float("nan"))
    scores[all_neg.repeat_interleave(4)] = torch.tensor([min(1.0, 0.15 * len(t)) for t in judge.seen])
    expected = allneg_aifeedback_advantages(rewards, 4, judge_scores=scores)
    torch.testing.assert_close(inputs["advantages"].sort().values, expected.sort().values)  # TRL shuffles rows
    assert expected.view(-1, 4)[all_neg].abs().sum() > 0
    assert grads_differ(base_grads, grads)


@pytest.mark.parametrize("peft", [False, True])
def test_without_all_negative_group_judge_is_not_called_and_gradient_is_grpo(tmp_path, peft, judge):
    _, base_grads, base_inputs = one_step(sgpo(tmp_path / "base", peft, reward=row_parity_verifier))
    _, grads, inputs = one_step(sgpo(tmp_path / "sgpo", peft, reward=row_parity_verifier, **ON))
    assert judge.seen == []
    assert torch.equal(inputs["advantages"], base_inputs["advantages"])
    assert not grads_differ(base_grads, grads, atol=0.0)


def test_composes_with_gmpo_objective(tmp_path, judge):
    _, base_grads, _ = one_step(sgpo(tmp_path / "base", loss_type="gmpo"))
    trainer = sgpo(tmp_path / "sgpo", loss_type="gmpo", **ON)
    _, grads, _ = one_step(trainer)
    assert judge.seen and all(torch.isfinite(g).all() for g in grads.values())
    assert grads_differ(base_grads, grads)


def test_built_in_toy_judge_runs(tmp_path):
    trainer = sgpo(tmp_path, advantage_estimator="allneg_aifeedback", allneg_aifeedback_judge="arithmetic_prefix")
    _, grads, inputs = one_step(trainer)
    assert torch.isfinite(inputs["advantages"]).all() and all(torch.isfinite(g).all() for g in grads.values())
