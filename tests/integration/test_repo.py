"""RePO through the trainer on the tiny model: the second generation batch carries each prompt's replayed rollouts
with their stored behaviour log-probs in the ratio; the gradient differs from GRPO's (full and LoRA); replay is
training-only; the loss-token count includes the replayed tokens; composition with a trl_groupx objective; a resumed
run continues exactly."""

from __future__ import annotations

import copy

import pytest
import torch

import trl_groupx
from tests.conftest import assert_same_weights, build_trainer, grads_differ, one_step
from trl_groupx.advantages._prompt_keys import prompt_keys_from_ids
from trl_groupx.toy import arithmetic_dataset
from trl_groupx.trainer import VARIANT_STATE_NAME

G = 4
# Two prompts, both in every generation batch (8 rows = 2 groups of 4): the buffer holds 4 rollouts per prompt after
# the first batch, enough (repo_min_cache 4) to replay repo_k = 4 of them in the second.
DATASET = arithmetic_dataset(2, seed=0)
REPO = dict(rollout_filter="repo", repo_k=4, repo_min_cache=4, repo_max_cache=8, shuffle_dataset=False)  # official
# loss (grpo, beta 0) unless a test says otherwise


def _trainer(tmp_path, name, *, peft=False, **overrides):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path / name, peft=peft, dataset=DATASET,
                         num_generations=G, **{"loss_type": "grpo", **overrides})


def _two_steps(trainer, perturb: bool = False):
    first = one_step(trainer, seed=0)
    if perturb:  # an optimizer step's worth of change: the stored log-probs are now stale
        torch.manual_seed(123)
        with torch.no_grad():
            for p in trainer.model.parameters():
                if p.requires_grad:
                    p.add_(0.02 * torch.randn_like(p))
    return first, one_step(trainer, seed=1)


def _rows(inputs, which):
    """(prompt key, completion ids, behaviour log-probs, advantage) of the rows with `groupx_replay == which`."""
    keys = prompt_keys_from_ids(inputs["prompt_ids"], inputs["prompt_mask"]).tolist()
    out, old = [], inputs.get("old_per_token_logps")
    for i in range(inputs["completion_ids"].size(0)):
        if int(inputs["groupx_replay"][i]) != which:
            continue
        n = int(inputs["completion_mask"][i].sum())
        out.append((keys[i], inputs["completion_ids"][i, :n].tolist(), None if old is None else old[i, :n],
                    float(inputs["advantages"][i])))
    return out


def test_second_batch_carries_replayed_rows_with_stored_logps(tmp_path):
    trainer = _trainer(tmp_path, "repo", **REPO)
    (_, _, first), (loss, _, second) = _two_steps(trainer, perturb=True)
    assert "groupx_replay" in first and first["groupx_replay"].sum() == 0 and first["completion_ids"].size(0) == 8
    assert second["completion_ids"].size(0) == 16 and second["groupx_replay"].sum() == 8  # 2 prompts x k = 4

    # The replayed rows are the first batch's rollouts (the buffer held exactly 4 per prompt): same prompt, same
    # tokens, their behaviour log-probs from the first batch, and the advantage they had there (same rewards, same
    # block normalisation with eps 1e-4 as TRL's on-policy groups).
    stored = _rows(first, 0)
    replayed = _rows(second, 1)
    assert len(replayed) == len(stored) == 8
    for key, ids, logps, adv in replayed:
        match = [s for s in stored if s[0] == key and s[1] == ids and torch.equal(s[2], logps)]
        assert match, "a replayed row is not a stored rollout of its prompt"
        assert adv == pytest.approx(match[0][3], abs=1e-5)

    # The loss is the clipped surrogate with the stored log-probs in the ratio (stale after the perturbation),
    # one sequence mean over the 16 rows (grpo), recomputed here by hand.
    with torch.no_grad():
        ids = torch.cat([second["prompt_ids"], second["completion_ids"]], dim=1)
        att = torch.cat([second["prompt_mask"], second["completion_mask"]], dim=1)
        logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, att,
                                                                 second["completion_ids"].size(1))
    mask = second["completion_mask"].float()
    old = second["old_per_token_logps"]
    replay = second["groupx_replay"].bool()
    assert ((logps - old).abs() * mask)[replay].max() > 1e-3  # off-policy: ratio != 1 on replayed tokens
    ratio = torch.exp(logps - old)
    adv = second["advantages"][:, None]
    per_token = -torch.min(ratio * adv, ratio.clamp(1 - 0.2, 1 + 0.2) * adv)
    expected = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
    assert second["num_items_in_batch"] == mask.sum()  # on-policy and replayed loss tokens

    state = trainer.variant_state["repo"]
    assert {e["rewards"].shape[0] for e in state["prompts"].values()} == {8}  # two visits of 4, max_cache 8


@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
def test_gradient_differs_from_grpo_and_off_coef_zero_is_grpo(tmp_path, peft):
    _, (_, grpo_grads, grpo_inputs) = _two_steps(_trainer(tmp_path, "grpo", peft=peft))
    _, (_, repo_grads, repo_inputs) = _two_steps(_trainer(tmp_path, "repo", peft=peft, **REPO))
    grpo_inputs["groupx_replay"] = torch.zeros(8)
    assert sorted(r[:2] for r in _rows(repo_inputs, 0)) == sorted(r[:2] for r in _rows(grpo_inputs, 0))  # same batch
    assert grads_differ(grpo_grads, repo_grads)
    # Without the replayed part (c = 0) the gradient is GRPO's, scaled by the row count 8 / 16 of the sequence mean.
    _, (_, zero_grads, _) = _two_steps(_trainer(tmp_path, "zero", peft=peft, **REPO, repo_off_coef=0.0))
    for name, g in grpo_grads.items():
        assert torch.allclose(2 * zero_grads[name], g, rtol=1e-4, atol=1e-7), name


def test_no_replay_in_evaluation_and_state_untouched(tmp_path):
    trainer = _trainer(tmp_path, "repo", **REPO)
    one_step(trainer, seed=0)
    before = copy.deepcopy(trainer.variant_state["repo"])
    trainer.model.eval()
    torch.manual_seed(0)
    inputs = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    assert "groupx_replay" not in inputs and inputs["completion_ids"].size(0) == 8
    assert before["order"] == trainer.variant_state["repo"]["order"]
    assert [e["rewards"].shape[0] for e in before["prompts"].values()] == [
        e["rewards"].shape[0] for e in trainer.variant_state["repo"]["prompts"].values()]


def test_dapo_counts_replayed_tokens_and_composes_with_an_objective(tmp_path):
    _, (_, _, dapo) = _two_steps(_trainer(tmp_path, "dapo", **REPO, loss_type="dapo"))
    assert dapo["num_items_in_batch"] == dapo["completion_mask"].sum()
    replay = dapo["groupx_replay"].bool()
    assert dapo["completion_mask"][replay].sum() > 0
    # a trl_groupx objective (GMPO) with replayed rows: runs, and the replayed part changes its gradient
    _, (_, gmpo, _) = _two_steps(_trainer(tmp_path, "gmpo", loss_type="gmpo"))
    _, (_, both, inputs) = _two_steps(_trainer(tmp_path, "gmpo_repo", **REPO, loss_type="gmpo"))
    assert inputs["groupx_replay"].sum() == 8
    assert grads_differ(gmpo, both)


def test_resume_continues_exactly(tmp_path):
    def run(path, resume=None):
        trainer = _trainer(tmp_path, path, **REPO, max_steps=3, save_strategy="steps", save_steps=1)
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    full = run("full")
    checkpoint = tmp_path / "full" / "checkpoint-2"
    saved = torch.load(checkpoint / VARIANT_STATE_NAME, weights_only=True)
    assert {e["rewards"].shape[0] for e in saved["repo"]["prompts"].values()} == {8}  # two visits saved
    assert full.state.log_history[1]["groupx/repo_replayed_rows"] == 8.0  # replay ran at step 2
    resumed = run("resumed", resume=str(checkpoint))
    a, b = full.variant_state["repo"], resumed.variant_state["repo"]
    assert a["order"] == b["order"]
    for key in a["prompts"]:
        for name in ("completion_ids", "logps", "lengths", "rewards"):
            assert torch.equal(a["prompts"][key][name], b["prompts"][key][name]), (key, name)
    assert_same_weights(full, resumed)


def _unscored_parity(completions, **kwargs):
    """Parity of the last character; every fourth completion (from the second) unscored (None)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [None if i % 4 == 1 else float(ord(t[-1]) % 2) if t else 0.0 for i, t in enumerate(texts)]


def test_unscored_and_truncated_rollouts_replay_safely(tmp_path):
    """Rollouts without a reward are replayed with advantage 0; truncated completions masked out at generation
    are stored empty and replayed without a loss token; the loss and the gradient stay finite."""
    trainer = _trainer(tmp_path, "repo", **REPO, reward_funcs=_unscored_parity, max_completion_length=3,
                       mask_truncated_completions=True)
    (_, _, first), (loss, grads, second) = _two_steps(trainer)
    replay = second["groupx_replay"].bool()
    assert replay.sum() == 8
    state = trainer.variant_state["repo"]
    for entry in state["prompts"].values():
        nan_rows = torch.isnan(entry["rewards"]).all(-1)
        assert nan_rows.sum() == 2  # one unscored rollout per visit of 4
    stored_nan = sum(int(torch.isnan(e["rewards"][:4]).all(-1).sum()) for e in state["prompts"].values())
    assert stored_nan == 2  # the first visit's unscored rollouts, both replayed ...
    assert (second["advantages"][replay] == 0).sum() >= stored_nan  # ... with advantage 0
    empty = (second["completion_mask"][replay].sum(-1) == 0).sum()
    assert empty > 0 and empty == (first["completion_mask"].sum(-1) == 0).sum()  # masked-out rollouts came back empty
    assert torch.isfinite(loss) and all(torch.isfinite(g).all() for g in grads.values())
