"""With no trl_groupx flag set, our trainer is TRL's: same loss and same gradient on every parameter."""

import itertools

import pytest
import torch
import trl

import trl_groupx
from tests.conftest import build_trainer, one_step

LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]
CASES = list(itertools.product(LOSS_TYPES, ["token", "sequence"], [0.0, 0.04], [False, True]))


@pytest.mark.parametrize("loss_type, level, beta, peft", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_same_loss_and_gradients_as_trl(tmp_path, loss_type, level, beta, peft):
    flags = dict(loss_type=loss_type, importance_sampling_level=level, beta=beta)
    theirs = build_trainer(trl.GRPOTrainer, trl.GRPOConfig, tmp_path / "trl", peft=peft, **flags)
    ours = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path / "ours", peft=peft, **flags)
    loss_t, grads_t, inputs_t = one_step(theirs)
    loss_o, grads_o, inputs_o = one_step(ours)

    assert torch.equal(inputs_t["completion_ids"], inputs_o["completion_ids"])
    assert torch.equal(inputs_t["advantages"], inputs_o["advantages"])
    assert torch.equal(loss_t, loss_o)
    assert grads_t.keys() == grads_o.keys() and len(grads_t) > 0
    for name in grads_t:
        assert torch.equal(grads_t[name], grads_o[name]), name
    assert any(g.abs().sum() > 0 for g in grads_o.values())  # the step does move the model
