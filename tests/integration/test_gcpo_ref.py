"""GCPO reference injection on the tiny model: the injected completion, its re-scored reward and positive advantage,
its recomputed log-probs, the gradient vs plain GRPO (full and LoRA), a composition, construction errors."""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, generate_first_batch, grads_differ, one_step
from tests.integration.scripted_rewards import FirstCallPattern
from trl_groupx.toy import arithmetic_dataset

G = 4  # conftest: num_generations 4, per_device_train_batch_size 8 -> 2 groups per generation call
_BASE = arithmetic_dataset(64, seed=0)
DATASET = _BASE.add_column("solution", list(_BASE["answer"]))  # the reference solution: the answer's text


def _reward(mismatch: str = "") -> FirstCallPattern:
    """Generation call: group 0 = [1, 0, 0, 0] (mixed), every other group all 0 (all fail). Later calls (the
    re-scoring of injected references): exact match with the dataset's `solution` (`mismatch` adds a suffix, so
    the reference scores as a failure)."""
    return FirstCallPattern(lambda texts, solution, **_: [float(t == s + mismatch) for t, s in zip(texts, solution)])


def _trainer(tmp_path, peft=False, gcpo=True, reward=None, **flags):
    flags = {"shuffle_dataset": False, "max_completion_length": 8, **flags}
    if gcpo:
        flags.setdefault("rollout_filter", "gcpo_ref")
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, dataset=DATASET,
                         reward_funcs=reward or _reward(), **flags)


def _group_formula(r):
    r = r.view(-1, G)
    return ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).flatten()


@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
def test_reference_replaces_the_last_rollout_of_the_all_fail_group(tmp_path, peft):
    reward = _reward()
    trainer = _trainer(tmp_path, peft, reward=reward)
    plain = _trainer(tmp_path, peft, gcpo=False, reward=_reward())
    batch, output = generate_first_batch(trainer)
    _, plain_output = generate_first_batch(plain)
    tok = trainer.processing_class
    reference = tok(batch[7]["solution"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    n = len(reference)
    assert output["completion_ids"][7, :n].tolist() == reference
    assert output["completion_mask"][7].tolist() == [1] * n + [0] * (output["completion_mask"].size(1) - n)
    # every other row is the sampled rollout, as plain GRPO generated it (same seed)
    T = plain_output["completion_ids"].size(1)
    assert torch.equal(output["completion_ids"][:7, :T], plain_output["completion_ids"][:7])
    # the re-scoring call saw only the reference (one injected row on this single process)
    assert reward.calls[1] == [batch[7]["solution"]]
    r = trainer._rewards_per_func[:, 0]
    assert r.tolist() == [1.0, 0, 0, 0, 0, 0, 0, 1.0]
    torch.testing.assert_close(output["advantages"], _group_formula(r))
    assert output["advantages"][7] > 0 and (output["advantages"][4:7] < 0).all()
    torch.testing.assert_close(output["advantages"][:4], plain_output["advantages"][:4])  # mixed group untouched
    assert plain_output["advantages"][4:].abs().max() < 1e-6  # plain GRPO: the all-fail group has no signal
    assert output["num_items_in_batch"] == output["completion_mask"].sum()
    metrics = trainer._metrics["train"]
    assert metrics["groupx/reference_injected_groups"] == [1.0] and metrics["groupx/reference_failed"] == [0.0]


@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
def test_gradient_differs_from_plain_grpo(tmp_path, peft):
    # plain GRPO: group 1 is all 0 -> advantage 0, only group 0 trains; GCPO: group 1 trains toward the reference
    _, g_gcpo, _ = one_step(_trainer(tmp_path, peft))
    _, g_plain, _ = one_step(_trainer(tmp_path, peft, gcpo=False))
    assert grads_differ(g_gcpo, g_plain)


def test_injected_row_log_probs_are_recomputed(tmp_path):
    # steps_per_generation 2 with gradient_accumulation_steps 1: TRL keeps old log-probs; beta > 0: reference ones.
    # Generation batch 16 -> 4 groups: group 0 mixed, groups 1-3 all fail -> rows 7, 11, 15 injected.
    trainer = _trainer(tmp_path, steps_per_generation=2, beta=0.04)
    _, output = generate_first_batch(trainer)
    rows = [7, 11, 15]
    assert trainer._metrics["train"]["groupx/reference_injected_groups"] == [3.0]
    assert trainer._rewards_per_func[rows, 0].tolist() == [1.0, 1.0, 1.0]
    index = torch.tensor(rows)
    sub = {k: output[k][index] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}
    mask = sub["completion_mask"]
    current, _ = trainer._rollout_logps(sub, trainer.model, compute_entropy=False)
    ref, _ = trainer._rollout_logps(sub, trainer.ref_model, compute_entropy=False)
    torch.testing.assert_close(output["old_per_token_logps"][index], current * mask)
    torch.testing.assert_close(output["ref_per_token_logps"][index], ref * mask)
    # the untouched rows keep TRL's values: recompute row 0 and compare on its real tokens
    sub0 = {k: output[k][:1] for k in sub}
    cur0, _ = trainer._rollout_logps(sub0, trainer.model, compute_entropy=False)
    m0 = sub0["completion_mask"].bool()
    torch.testing.assert_close(output["old_per_token_logps"][:1][m0], cur0[m0])


def test_reference_scored_as_failure_is_kept_and_counted(tmp_path):
    trainer = _trainer(tmp_path, reward=_reward(mismatch="!"))
    _, output = generate_first_batch(trainer)
    assert trainer._rewards_per_func[:, 0].tolist() == [1.0, 0, 0, 0, 0, 0, 0, 0]
    assert trainer._metrics["train"]["groupx/reference_failed"] == [1.0]
    assert output["advantages"][4:].abs().max() < 1e-6  # still an all-fail group: no signal


def test_composes_with_rloo(tmp_path):
    trainer = _trainer(tmp_path, advantage_estimator="rloo")
    _, output = generate_first_batch(trainer)
    # RLOO on group 1 = [0, 0, 0, 1]: A_i = r_i - mean of the other three -> [-1/3, -1/3, -1/3, 1]
    torch.testing.assert_close(output["advantages"][4:], torch.tensor([-1 / 3, -1 / 3, -1 / 3, 1.0]))
    _, g, _ = one_step(_trainer(tmp_path, advantage_estimator="rloo"))
    _, g_plain, _ = one_step(_trainer(tmp_path, gcpo=False, advantage_estimator="rloo"))
    assert grads_differ(g, g_plain)


def test_template_wraps_the_reference(tmp_path):
    # the reward matches "=<answer>." exactly: the template turns the bare answer into that completion
    trainer = _trainer(tmp_path, reward=_reward(), gcpo_ref_template="={ref}.")
    batch, output = generate_first_batch(trainer)
    tok = trainer.processing_class
    expected = tok("=" + batch[7]["solution"] + ".", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert output["completion_ids"][7, : len(expected)].tolist() == expected
    assert trainer._rewards_per_func[7, 0] == 0.0  # FirstCallPattern wants the bare answer: the template fails it
    assert trainer._metrics["train"]["groupx/reference_failed"] == [1.0]


def test_evaluation_never_injects(tmp_path):
    trainer = _trainer(tmp_path)
    trainer.model.eval()
    torch.manual_seed(0)
    batch = [dict(DATASET[i]) for i in range(2) for _ in range(G)]
    trainer._generate_and_score_completions(batch)
    assert "groupx/reference_injected_groups" not in trainer._metrics["eval"]


def test_row_without_a_reference_fails_clearly(tmp_path):
    dataset = _BASE.add_column("solution", [""] * len(_BASE))
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, dataset=dataset,
                            reward_funcs=_reward(), rollout_filter="gcpo_ref", shuffle_dataset=False)
    with pytest.raises(ValueError, match="no reference solution in gcpo_ref_column='solution'"):
        generate_first_batch(trainer)


def test_missing_reference_column_fails_at_construction(tmp_path):
    with pytest.raises(ValueError, match="gcpo_ref_column='reference'.*lacks"):
        _trainer(tmp_path, gcpo_ref_column="reference")


def test_rollout_func_is_refused(tmp_path):
    def rollout_func(prompts, trainer):  # never called: construction fails first
        raise AssertionError

    with pytest.raises(ValueError, match="gcpo_ref.*rollout_func"):
        build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, dataset=DATASET,
                      reward_funcs=_reward(), rollout_func=rollout_func, rollout_filter="gcpo_ref")


def test_paper_flags_train(tmp_path):
    # the variant's flags (sequence-level importance ratio, beta 0) against the same flags without the injection
    flags = {k: v for k, v in trl_groupx.get_variant("gcpo_ref").flags.items() if k != "rollout_filter"}
    loss, g, _ = one_step(_trainer(tmp_path, **flags, rollout_filter="gcpo_ref"))
    _, g_plain, _ = one_step(_trainer(tmp_path, gcpo=False, importance_sampling_level="sequence", beta=0.0))
    assert torch.isfinite(loss) and grads_differ(g, g_plain)


@pytest.mark.parametrize("masked", [False, True], ids=["kept", "masked"])
def test_truncated_reference_follows_mask_truncated_completions(tmp_path, masked):
    # max_completion_length 1: the two-digit answer is cut to its first character, without EOS
    trainer = _trainer(tmp_path, max_completion_length=1, mask_truncated_completions=masked)
    batch, output = generate_first_batch(trainer)
    first = trainer.processing_class(batch[7]["solution"], add_special_tokens=False)["input_ids"][0]
    assert output["completion_ids"][7].tolist() == [first]
    assert output["completion_mask"][7].tolist() == [0 if masked else 1]
    assert output["num_items_in_batch"] == output["completion_mask"].sum()
