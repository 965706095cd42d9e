"""NAT on the tiny model: one real step, full and LoRA; Horvitz–Thompson token advantages recomputed exactly from the
sequence advantages, the config seed and the global step; the gradient differs from GRPO; a resumed run is identical.
"""

import pytest
import torch

import trl_groupx
from tests.conftest import assert_same_weights, build_trainer, grads_differ, one_step
from trl_groupx.contracts import TokenContext
from trl_groupx.token_weights import nat_token_advantages


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


def capture_stage(trainer):
    """Record the global (unshuffled) sequence advantages entering the token stage and the batch leaving it; TRL
    shuffles the generation batch before `one_step` sees it."""
    seen = {}
    compute, generate = trainer.compute_advantages, trainer._generate_and_score_completions

    def compute_advantages(*args, **kwargs):
        seen["seq"] = compute(*args, **kwargs).clone()
        return seen["seq"]

    def generate_and_score(inputs):
        out = generate(inputs)
        seen.update(token=out["advantages"].clone(), mask=out["completion_mask"].clone())
        return out

    trainer.compute_advantages, trainer._generate_and_score_completions = compute_advantages, generate_and_score
    return seen


@pytest.mark.parametrize("peft", [False, True])
@pytest.mark.parametrize("scheme", ["urs", "rpc"])
def test_nat_weights_and_gradient(tmp_path, peft, scheme):
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", peft, loss_type="dapo"))
    trainer = ours(tmp_path / "nat", peft, loss_type="dapo", token_weighting="nat", nat_scheme=scheme)
    seen = capture_stage(trainer)
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])  # same batch, same shuffle
    adv, mask = inputs["advantages"], inputs["completion_mask"]
    assert adv.shape == mask.shape and (adv[mask == 0] == 0).all()
    # the sequence advantages are TRL's (same multiset as the plain run's)
    torch.testing.assert_close(seen["seq"].sort().values, base_inputs["advantages"].sort().values)
    # exact numbers: config seed 0, global step 0 (single process: the global batch is the local one)
    expected = nat_token_advantages(
        seen["seq"], TokenContext(seen["mask"], 4), nat_scheme=scheme, nat_keep_prob=0.5,
        nat_rpc_min_fraction=0.0, seed=0, global_step=0,
    )
    torch.testing.assert_close(seen["token"], expected)
    torch.testing.assert_close(adv.sum(-1).sort().values, expected.sum(-1).sort().values)  # shuffled rows
    dropped = mask.bool() & (adv == 0) & (base_inputs["advantages"][:, None] != 0)
    assert dropped.any()  # some real tokens with a non-zero advantage were left out this step
    assert grads_differ(base_grads, grads)


@pytest.mark.parametrize("loss_type", ["cispo", "grpo"])
def test_nat_composes_with_objectives_and_advantages(tmp_path, loss_type):
    _, base_grads, _ = one_step(ours(tmp_path / "base", loss_type=loss_type, advantage_estimator="sign_adv"))
    trainer = ours(tmp_path / "nat", loss_type=loss_type, advantage_estimator="sign_adv", token_weighting="nat",
                   nat_scheme="rpc")
    loss, grads, inputs = one_step(trainer)
    assert torch.isfinite(loss) and torch.isfinite(inputs["advantages"]).all()
    assert grads_differ(base_grads, grads)


def test_nat_resumed_run_is_identical(tmp_path):
    settings = dict(token_weighting="nat", max_steps=2, save_strategy="steps", save_steps=1)
    full = ours(tmp_path / "full", **settings)
    full.train()
    resumed = ours(tmp_path / "resumed", **settings)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-1"))
    assert_same_weights(full, resumed)
