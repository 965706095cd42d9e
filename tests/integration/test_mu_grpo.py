"""Mu-GRPO negative-advantage veto on the tiny model: one real step, full and LoRA.

The tiny model's 6-token completions rarely hold a token below p = 0.01, so the step uses a threshold of 0.5 to
be sure that some negative completions are vetoed; the numbers are checked against a recomputation.
"""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step
from trl_groupx.contracts import TokenContext
from trl_groupx.token_weights import mu_grpo_token_advantages


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


@pytest.mark.parametrize("peft", [False, True])
def test_mu_grpo_vetoes_negative_suffixes_and_changes_gradient(tmp_path, peft):
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", peft, loss_type="grpo"))
    trainer = ours(tmp_path / "mu", peft, loss_type="grpo", token_weighting="mu_grpo", mu_grpo_veto_threshold=0.5)
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])  # same batch, same order
    adv, mask = inputs["advantages"], inputs["completion_mask"]
    seq = base_inputs["advantages"]
    # positive completions untouched; some negative tokens vetoed
    pos = (seq > 0)[:, None] & mask.bool()
    torch.testing.assert_close(adv[pos], seq[:, None].expand_as(adv)[pos])
    assert ((adv == 0) & mask.bool() & (seq < 0)[:, None]).any()
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    att = torch.cat([inputs["prompt_mask"], mask], 1)
    with torch.no_grad():
        logps, ent, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, att, inputs["completion_ids"].size(1), compute_entropy=True
        )
    expected = mu_grpo_token_advantages(
        seq, TokenContext(mask, 4, entropies=ent, logps=logps), mu_grpo_veto_trigger="low_prob",
        mu_grpo_veto_threshold=0.5, mu_grpo_veto_inclusive=True,
    )
    torch.testing.assert_close(adv, expected)
    assert grads_differ(base_grads, grads)


@pytest.mark.parametrize("loss_type", ["cispo", "dapo"])
def test_mu_grpo_composes_with_other_objectives(tmp_path, loss_type):
    _, base_grads, _ = one_step(ours(tmp_path / "base", loss_type=loss_type, epsilon_high=0.6))
    trainer = ours(tmp_path / "mu", loss_type=loss_type, epsilon_high=0.6, token_weighting="mu_grpo",
                   mu_grpo_veto_threshold=0.5)
    loss, grads, inputs = one_step(trainer)
    assert torch.isfinite(loss) and torch.isfinite(inputs["advantages"]).all()
    assert grads_differ(base_grads, grads)
