"""VeriGate step credit: one real step on the tiny model, full and LoRA. The verifier fails every completion of a
prompt with an even answer (a degenerate group) and mixes within the other groups: the PRM sees exactly the
degenerate groups' completions, split into steps at the delimiter; mixed rows carry GRPO's advantage on every token,
degenerate rows the group-normalised reward-to-go of their steps; the gradient differs from plain GRPO's. With no
degenerate group the PRM is never called and the gradient is GRPO's."""

import math

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step
from trl_groupx.advantages import group_normalized_advantages
from trl_groupx.token_weights.verigate_step import register_step_prm

DELIMITER = "2"  # the tiny model writes digits: "2" splits many of its answers into steps


def gated_verifier(completions, answer, **kwargs) -> list[float]:
    """0 on every completion of a prompt whose answer is even, else 1 on odd rows of the batch (a group's rows are
    contiguous, so such a group mixes 0 and 1). Keeps the last batch's completion texts, in row order."""
    gated_verifier.texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [0.0 if int(a) % 2 == 0 else float(i % 2) for i, a in enumerate(answer)]


def row_parity_verifier(completions, **kwargs) -> list[float]:
    """1 on odd rows: every group mixes, none is degenerate."""
    return [float(i % 2) for i in range(len(completions))]


def step_score(step: str) -> float:
    return (sum(map(ord, step)) % 5) / 4  # varied, deterministic scores in [0, 1]


class RecordingPRM:
    def __init__(self):
        self.completions: list[str] = []
        self.steps: list[list[str]] = []

    def __call__(self, prompts, completions, steps, **kwargs):
        self.completions.extend(c[0]["content"] for c in completions)
        self.steps.extend(steps)
        return [[step_score(s) for s in row] for row in steps]


@pytest.fixture
def prm():
    prm = RecordingPRM()
    register_step_prm("recording_test_prm", prm)
    return prm


ON = {"token_weighting": "verigate_step", "verigate_step_prm": "recording_test_prm",
      "verigate_step_delimiter": DELIMITER}


def make(tmp_path, peft=False, reward=gated_verifier, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, reward_funcs=[reward],
                         **flags)


def expected_step_values(steps: list[list[str]]) -> list[float]:
    """Every value the degenerate group's tokens may take: its pooled reward-to-go z-scores (independent of the
    variant's code: plain Python)."""
    to_go = [[sum(step_score(s) for s in row[k:]) for k in range(len(row))] for row in steps]
    pooled = [r for row in to_go for r in row]
    mean = sum(pooled) / len(pooled)
    std = math.sqrt(sum((r - mean) ** 2 for r in pooled) / (len(pooled) - 1))
    return [(r - mean) / (std + 1e-4) for r in pooled]


@pytest.mark.parametrize("peft", [False, True])
def test_step_credit_changes_gradient_and_mixed_rows_keep_grpo(tmp_path, peft, prm):
    _, base_grads, base_inputs = one_step(make(tmp_path / "base", peft))
    trainer = make(tmp_path / "vgs", peft, **ON)
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])  # same batch
    rewards = trainer._rewards_per_func[:, 0]
    degenerate = rewards.view(-1, 4).amax(1) == rewards.view(-1, 4).amin(1)
    assert degenerate.any() and not degenerate.all(), rewards  # the fixture gives both kinds of group
    rows = degenerate.repeat_interleave(4).nonzero().flatten().tolist()
    assert prm.completions == [gated_verifier.texts[i] for i in rows]  # the PRM saw the degenerate groups only
    assert any(len(s) > 1 for s in prm.steps)  # some completion has several steps
    for row_steps, text in zip(prm.steps, prm.completions, strict=True):
        assert "".join(row_steps) == text and all(s.endswith(DELIMITER) for s in row_steps[:-1])
    mask = inputs["completion_mask"].bool()
    adv = inputs["advantages"]
    assert adv.shape == mask.shape and (adv[~mask] == 0).all()
    # mixed rows: one value on every real token, GRPO's; TRL shuffles rows, so compare as multisets
    grpo = group_normalized_advantages(rewards, 4).view(-1, 4)[~degenerate].flatten()
    per_row = [adv[i][mask[i]] for i in range(adv.shape[0])]
    constant = [r[0].item() for r in per_row if (r == r[0]).all() and r[0].abs() > 1e-6]
    mixed_values = sorted(v for v in constant if any(abs(v - g) < 1e-5 for g in grpo.tolist()))
    assert mixed_values == pytest.approx(sorted(grpo.tolist()), abs=1e-5)
    # degenerate rows: every token value is one of its group's pooled reward-to-go z-scores
    allowed = [v for g in range(int(degenerate.sum())) for v in expected_step_values(prm.steps[4 * g: 4 * g + 4])]
    grpo_set = grpo.tolist()
    step_tokens = [v for r in per_row for v in r.tolist() if not any(abs(v - g) < 1e-5 for g in grpo_set)]
    assert step_tokens and all(any(abs(v - a) < 1e-4 for a in allowed) for v in step_tokens)
    assert grads_differ(base_grads, grads)


@pytest.mark.parametrize("peft", [False, True])
def test_without_degenerate_group_prm_is_not_called_and_gradient_is_grpo(tmp_path, peft, prm):
    _, base_grads, base_inputs = one_step(make(tmp_path / "base", peft, reward=row_parity_verifier))
    _, grads, inputs = one_step(make(tmp_path / "vgs", peft, reward=row_parity_verifier, **ON))
    assert prm.completions == []
    mask = inputs["completion_mask"].bool()
    expected = base_inputs["advantages"][:, None].expand_as(mask) * mask
    assert torch.equal(inputs["advantages"], expected)
    assert not grads_differ(base_grads, grads, atol=1e-7)


def test_composes_with_rloo_advantages_and_dapo_loss(tmp_path, prm):
    # the advantage stage's RLOO numbers on the mixed groups' tokens, step credit on the degenerate ones, dapo's
    # token-mean loss
    trainer = make(tmp_path, advantage_estimator="rloo", loss_type="dapo", **ON)
    _, grads, _ = one_step(trainer)
    assert prm.completions and all(torch.isfinite(g).all() for g in grads.values())
    assert any(g.abs().sum() > 0 for g in grads.values())


def test_built_in_toy_prm_runs(tmp_path):
    trainer = make(tmp_path, token_weighting="verigate_step", verigate_step_prm="arithmetic_steps",
                   verigate_step_delimiter=DELIMITER)
    _, grads, inputs = one_step(trainer)
    assert torch.isfinite(inputs["advantages"]).all() and all(torch.isfinite(g).all() for g in grads.values())
