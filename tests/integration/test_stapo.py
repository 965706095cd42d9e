"""STAPO on the tiny model: one real step, full and LoRA; spurious tokens masked, gradient differs from GRPO.

The tiny model's 6-token completions have few tokens below the paper's τ_p = 0.002, so the step uses τ_p = 0.5
to be sure that some tokens are masked; the numbers are checked against a recomputation from the inputs.
"""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step
from trl_groupx.contracts import TokenContext
from trl_groupx.token_weights import stapo_token_advantages


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


def rollout_logps_entropies(trainer, inputs):
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    with torch.no_grad():
        logps, ent, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, att, inputs["completion_ids"].size(1), compute_entropy=True
        )
    return logps, ent


@pytest.mark.parametrize("peft", [False, True])
def test_stapo_masks_spurious_tokens_and_changes_gradient(tmp_path, peft):
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", peft, loss_type="dapo"))
    flags = dict(token_weighting="stapo", stapo_prob_threshold=0.5, stapo_entropy_quantile=0.75)
    trainer = ours(tmp_path / "stapo", peft, loss_type="dapo", **flags)
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])  # same batch, same order
    adv, mask = inputs["advantages"], inputs["completion_mask"]
    assert adv.shape == inputs["completion_ids"].shape and (adv[mask == 0] == 0).all()
    # some real tokens of positive completions were silenced (advantage exactly 0), negatives untouched
    seq = base_inputs["advantages"]
    silenced = (adv == 0) & mask.bool() & (seq[:, None] > 0)
    assert silenced.any()
    assert (adv[(seq < 0)[:, None].expand_as(adv) & mask.bool()] < 0).all()
    # exact numbers: recompute from the rollout policy's log-probs and entropies (the weights have not moved)
    logps, ent = rollout_logps_entropies(trainer, inputs)
    ctx = TokenContext(mask, 4, entropies=ent, logps=logps)
    expected = stapo_token_advantages(seq, ctx, stapo_prob_threshold=0.5, stapo_entropy_quantile=0.75,
                                      stapo_renormalize="token")
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=1e-5)
    assert grads_differ(base_grads, grads)


@pytest.mark.parametrize("loss_type,renorm", [("cispo", "token"), ("grpo", "sequence")])
def test_stapo_composes_with_other_objectives(tmp_path, loss_type, renorm):
    _, base_grads, _ = one_step(ours(tmp_path / "base", loss_type=loss_type))
    trainer = ours(tmp_path / "stapo", loss_type=loss_type, token_weighting="stapo", stapo_prob_threshold=0.5,
                   stapo_renormalize=renorm)
    loss, grads, inputs = one_step(trainer)
    assert torch.isfinite(loss) and torch.isfinite(inputs["advantages"]).all()
    assert grads_differ(base_grads, grads)
