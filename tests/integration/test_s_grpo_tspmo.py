"""S-GRPO / T-SPMO on the tiny model: one real step, full and LoRA; the token credit is the trie credit of the real
batch (exact recomputation, and per completion it telescopes to its sequence advantage); the gradient differs from
GRPO's; composition with an advantage estimator and with other objectives, S-GRPO's token subset included.
"""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step
from trl_groupx.contracts import TokenContext
from trl_groupx.token_weights import s_grpo_tspmo_token_advantages


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


def capture_stage(trainer):
    """Record the global (unshuffled) sequence advantages entering the token stage and the batch leaving it."""
    seen = {}
    compute, generate = trainer.compute_advantages, trainer._generate_and_score_completions

    def compute_advantages(*args, **kwargs):
        seen["seq"] = compute(*args, **kwargs).clone()
        return seen["seq"]

    def generate_and_score(inputs):
        out = generate(inputs)
        seen.update(token=out["advantages"].clone(), mask=out["completion_mask"].clone(),
                    ids=out["completion_ids"].clone())
        return out

    trainer.compute_advantages, trainer._generate_and_score_completions = compute_advantages, generate_and_score
    return seen


@pytest.mark.parametrize("peft", [False, True])
def test_tspmo_credit_and_gradient(tmp_path, peft):
    _, base_grads, base_inputs = one_step(ours(tmp_path / "base", peft, loss_type="dapo"))
    trainer = ours(tmp_path / "tspmo", peft, loss_type="dapo", token_weighting="s_grpo_tspmo")
    seen = capture_stage(trainer)
    _, grads, inputs = one_step(trainer)
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])  # same batch, same shuffle
    adv, mask = inputs["advantages"], inputs["completion_mask"]
    assert adv.shape == mask.shape and (adv[mask == 0] == 0).all()
    torch.testing.assert_close(seen["seq"].sort().values, base_inputs["advantages"].sort().values)
    expected = s_grpo_tspmo_token_advantages(
        seen["seq"], TokenContext(seen["mask"], 4, completion_ids=seen["ids"]), s_grpo_tspmo_credit="prefix",
        s_grpo_tspmo_keep_prob=1.0,
    )
    torch.testing.assert_close(seen["token"], expected)
    # independent of the implementation: credits telescope to v_i − mean_group(v) for a completion no other one in
    # its group duplicates (TRL's group-normalised advantages have mean 0 in each group)
    width = seen["ids"].shape[1]
    seq, ids, m = seen["seq"].view(-1, 4), seen["ids"].view(-1, 4, width), seen["mask"].view(-1, 4, width)
    token = seen["token"].view(-1, 4, width)
    unique = 0
    for grp in range(seq.shape[0]):
        paths = [tuple(ids[grp, k][m[grp, k].bool()].tolist()) for k in range(4)]
        for k in range(4):
            if paths.count(paths[k]) == 1:
                unique += 1
                torch.testing.assert_close(token[grp, k].sum(), seq[grp, k] - seq[grp].mean(), atol=1e-5, rtol=0)
    assert unique > 0
    # credit is local: real tokens after a completion's last branch point get 0 although its sequence advantage
    # is not 0
    assert (mask.bool() & (adv == 0) & (base_inputs["advantages"][:, None] != 0)).any()
    assert grads_differ(base_grads, grads)
    if peft:
        assert grads and all("lora_" in name for name in grads)  # only the adapter trains


@pytest.mark.parametrize(
    "flags",
    [
        dict(loss_type="grpo", advantage_estimator="sign_adv"),
        dict(loss_type="cispo", s_grpo_tspmo_credit="sequence", s_grpo_tspmo_keep_prob=0.5),
        dict(loss_type="dapo", s_grpo_tspmo_keep_prob=0.5),
    ],
)
def test_composes_with_advantages_and_objectives(tmp_path, flags):
    base_flags = {k: v for k, v in flags.items() if not k.startswith("s_grpo_tspmo")}
    _, base_grads, _ = one_step(ours(tmp_path / "base", **base_flags))
    trainer = ours(tmp_path / "ours", token_weighting="s_grpo_tspmo", **flags)
    loss, grads, inputs = one_step(trainer)
    assert torch.isfinite(loss) and torch.isfinite(inputs["advantages"]).all()
    assert grads_differ(base_grads, grads)
