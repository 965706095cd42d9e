"""SGPO all-negative rescue (allneg_aifeedback): the judge's scores replace the rewards of the groups whose responses
are all wrong, then GRPO's normalisation; derivations in comments. No official code (arXiv:2505.11595)."""

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

import trl_groupx
from trl_groupx.advantages import group_normalized_advantages
from trl_groupx.advantages.allneg_aifeedback import (
    all_negative_groups,
    judge_scores_for_batch,
    register_allneg_judge,
    rows_to_judge,
)
from trl_groupx.advantages.allneg_aifeedback import allneg_aifeedback_advantages as sgpo
from trl_groupx.toy import load_tiny_tokenizer

NAN = float("nan")
EPS = 1e-4


def test_hand_derived_mixed_group_untouched_all_negative_group_judged():
    # group 0 [1,0,0,1] is mixed: GRPO, mean .5, unbiased std sqrt(1/3) → ±.5/(sqrt(1/3)+1e-4); its judge entries
    # (garbage here) are never read.
    # group 1 [0,0,0,0] is all-negative: rewards ← judge [.5, 0, 1, .5], mean .5, deviations [0, −.5, .5, 0],
    # unbiased var (.25+.25)/3 = 1/6 → A = [0, −.5, .5, 0] / (sqrt(1/6) + 1e-4)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    judge = torch.tensor([7.0, -3.0, NAN, 9.0, 0.5, 0.0, 1.0, 0.5])
    a, b = 0.5 / (math.sqrt(1 / 3) + EPS), 0.5 / (math.sqrt(1 / 6) + EPS)
    torch.testing.assert_close(sgpo(rewards, 4, judge_scores=judge), torch.tensor([a, -a, -a, a, 0.0, -b, b, 0.0]))


def test_no_all_negative_group_is_grpo_bit_for_bit():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0])
    for scale in ("group", "batch", "none"):
        expected = group_normalized_advantages(rewards, 4, scale_rewards=scale)
        assert torch.equal(sgpo(rewards, 4, judge_scores=torch.rand(8), scale_rewards=scale), expected)
    # all-correct groups are not "all negative" either: GRPO's 0
    assert torch.equal(sgpo(torch.ones(4), 4, judge_scores=torch.tensor([0.1, 0.2, 0.3, 0.4])), torch.zeros(4))


def test_rescued_group_has_nonzero_variance_where_grpo_has_none():
    rewards = torch.zeros(4)
    judge = torch.tensor([0.25, 0.75, 0.0, 0.5])
    assert torch.equal(group_normalized_advantages(rewards, 4), torch.zeros(4))
    out = sgpo(rewards, 4, judge_scores=judge)
    assert out.var() > 0.5 and out.argsort().tolist() == judge.argsort().tolist()  # ranked by the judge
    # the judge agreeing on every response leaves no signal (std 0 → 0)
    assert torch.equal(sgpo(rewards, 4, judge_scores=torch.full((4,), 0.3)), torch.zeros(4))


def test_nan_rewards_are_not_judged_and_nan_judge_scores_get_zero():
    # row 1 unscored (NaN): not judged even though the judge returned 0.9 for it, advantage 0; the group is still
    # all-negative (its scored rows are 0). Judged [.2, ·, .6, .4]: mean .4, var (.04+.04)/2 = .04 → std .2
    rewards = torch.tensor([0.0, NAN, 0.0, 0.0])
    assert rows_to_judge(rewards, 4, 0.0).tolist() == [True, False, True, True]
    out = sgpo(rewards, 4, judge_scores=torch.tensor([0.2, 0.9, 0.6, 0.4]))
    torch.testing.assert_close(out, torch.tensor([-0.2, 0.0, 0.2, 0.0]) / (0.2 + EPS))
    # the judge returned None (NaN) for row 3: left out of the statistics, advantage 0; [.2, .6] → ∓.2/(std .2828)
    out = sgpo(rewards, 4, judge_scores=torch.tensor([0.2, NAN, 0.6, NAN]))
    s = math.sqrt(0.08) + EPS
    torch.testing.assert_close(out, torch.tensor([-0.2 / s, 0.0, 0.2 / s, 0.0]))
    # an all-NaN group is not all-negative (nothing scored) and stays 0
    assert not all_negative_groups(torch.full((4,), NAN), 4, 0.0).any()
    assert torch.equal(sgpo(torch.full((4,), NAN), 4, judge_scores=torch.rand(4)), torch.zeros(4))


def test_group_size_two_and_one():
    # G=2, judged [.2, .8]: mean .5, unbiased std sqrt(.18) → ∓.3/(sqrt(.18)+1e-4) ≈ ∓.7069
    out = sgpo(torch.zeros(2), 2, judge_scores=torch.tensor([0.2, 0.8]))
    a = 0.3 / (math.sqrt(0.18) + EPS)
    torch.testing.assert_close(out, torch.tensor([-a, a]))
    with pytest.raises(ValueError, match="at least two responses"):
        sgpo(torch.zeros(3), 1, judge_scores=torch.rand(3))


def test_threshold_decides_what_is_wrong():
    rewards = torch.tensor([-1.0, 0.0, 0.0, -0.5])  # format penalties below the 0 of a failed answer
    assert all_negative_groups(rewards, 4, 0.0).tolist() == [True]
    assert all_negative_groups(rewards, 4, -0.5).tolist() == [False]  # 0.0 > -0.5: that response is not wrong
    judge = torch.tensor([0.0, 1.0, 0.0, 1.0])
    assert sgpo(rewards, 4, judge_scores=judge, allneg_aifeedback_fail_threshold=0.0)[1] > 0  # judged
    grpo = group_normalized_advantages(rewards, 4)
    assert torch.equal(sgpo(rewards, 4, judge_scores=judge, allneg_aifeedback_fail_threshold=-0.5), grpo)


def test_bad_inputs_raise_naming_the_cause():
    with pytest.raises(ValueError, match=r"allneg_aifeedback_judge: the judge returned \[1.5\]"):
        sgpo(torch.zeros(4), 4, judge_scores=torch.tensor([0.1, 1.5, 0.2, 0.3]))
    with pytest.raises(ValueError, match="infinite reward"):
        sgpo(torch.tensor([0.0, float("inf"), 0.0, 0.0]), 4, judge_scores=torch.rand(4))
    # a judge score outside [0, 1] on a row that is not judged is never read
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    assert torch.equal(sgpo(rewards, 4, judge_scores=torch.full((4,), 5.0)), group_normalized_advantages(rewards, 4))


def config(**kwargs):
    return trl_groupx.GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, **kwargs)


def test_config_refusals_name_the_flag():
    with pytest.raises(ValueError, match="allneg_aifeedback_judge is not set"):
        config(advantage_estimator="allneg_aifeedback")
    with pytest.raises(ValueError, match="allneg_aifeedback_judge='nope' is not registered"):
        config(advantage_estimator="allneg_aifeedback", allneg_aifeedback_judge="nope")
    with pytest.raises(ValueError, match="allneg_aifeedback_fail_threshold must be a finite number"):
        config(advantage_estimator="allneg_aifeedback", allneg_aifeedback_judge="arithmetic_prefix",
               allneg_aifeedback_fail_threshold=float("nan"))
    with pytest.raises(ValueError, match="belongs to variant 'allneg_aifeedback'"):
        config(allneg_aifeedback_judge="arithmetic_prefix")
    with pytest.raises(ValueError, match="must be callable"):
        register_allneg_judge("broken", 3)
    cfg = config(advantage_estimator="allneg_aifeedback", allneg_aifeedback_judge="arithmetic_prefix")
    assert cfg.active_variants() == {"advantages": "allneg_aifeedback"}


# ---- trainer glue: the judge sees the rows of all-negative groups only, decided on the global rewards ----------


class CountingJudge:
    """Records what it was called with; scores = 0.1 × the completion's length (capped at 1)."""

    def __init__(self):
        self.calls = []

    def __call__(self, prompts, completions, completion_ids, answer, **kwargs):
        self.calls.append({"prompts": prompts, "completions": completions, "answer": answer})
        return [min(1.0, 0.1 * len(c[0]["content"])) for c in completions]


def fake_trainer(tokenizer, rows, texts, *, process_index=0, num_processes=1, other_scores=None, training=True):
    """The attributes `judge_scores_for_batch` reads, for one process holding `rows` (its local input dicts) and
    completions `texts`; `gather` puts `other_scores` (the other process's local scores) before or after ours."""
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(len(i) for i in ids)
    completion_ids = torch.tensor([i + [0] * (width - len(i)) for i in ids])
    completion_mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in ids])

    def gather(local):
        return torch.cat([other_scores, local] if process_index == 1 else [local, other_scores])

    trainer = SimpleNamespace(
        args=SimpleNamespace(allneg_aifeedback_fail_threshold=0.0, allneg_aifeedback_judge="counting"),
        model=SimpleNamespace(training=training), _metrics=defaultdict(lambda: defaultdict(list)),
        accelerator=SimpleNamespace(process_index=process_index, num_processes=num_processes, gather=gather,
                                    device="cpu"),
        _rollout_inputs=rows, processing_class=tokenizer, state=None,
    )
    return trainer, {"completion_ids": completion_ids, "completion_mask": completion_mask}


def rows_of(prompts):
    return [{"prompt": [{"role": "user", "content": p}], "answer": p[-2:]} for p in prompts]


def test_judge_called_only_on_all_negative_groups():
    tokenizer = load_tiny_tokenizer()
    judge = CountingJudge()
    register_allneg_judge("counting", judge)
    # G=2, three groups: [1, 0] mixed, [0, 0] all-negative (one row padded shorter), [0, NaN] all-negative, its
    # NaN row unscored and not judged
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, NAN])
    texts = ["1", "22", "333", "4", "55555", "666666"]
    trainer, output = fake_trainer(tokenizer, rows_of(["a", "a", "b", "b", "c", "c"]), texts)
    scores = judge_scores_for_batch(trainer, output, rewards, 2)
    assert len(judge.calls) == 1
    call = judge.calls[0]
    assert [c[0]["content"] for c in call["completions"]] == ["333", "4", "55555"]  # padding never decoded
    assert [p[0]["content"] for p in call["prompts"]] == ["b", "b", "c"] and call["answer"] == ["b", "b", "c"]
    torch.testing.assert_close(scores, torch.tensor([NAN, NAN, 0.3, 0.1, 0.5, NAN]), equal_nan=True)
    assert trainer._metrics["train"]["groupx/allneg_judged_group_fraction"] == [pytest.approx(2 / 3)]
    # no all-negative group: no call; evaluation: no call
    judge.calls.clear()
    assert torch.isnan(judge_scores_for_batch(trainer, output, torch.tensor([1.0, 0.0] * 3), 2)).all()
    trainer.model.training = False
    assert torch.isnan(judge_scores_for_batch(trainer, output, rewards, 2)).all()
    assert judge.calls == []


@pytest.mark.parametrize("first_row_reward", [0.0, 1.0])
def test_second_process_judges_its_rows_by_the_global_group(first_row_reward):
    # N=6 over two processes (3 rows each), G=2: group (2, 3) straddles them. This is process 1 (global rows 3..5);
    # its row 3 is judged only when row 2, on process 0, is wrong too.
    tokenizer = load_tiny_tokenizer()
    judge = CountingJudge()
    register_allneg_judge("counting", judge)
    rewards = torch.tensor([1.0, 0.0, first_row_reward, 0.0, 0.0, 0.0])  # global; groups (0,1) (2,3) (4,5)
    other = torch.tensor([NAN, NAN, 0.9])  # process 0's local scores
    trainer, output = fake_trainer(tokenizer, rows_of(["b", "c", "c"]), ["4", "55", "666"], process_index=1,
                                   num_processes=2, other_scores=other)
    scores = judge_scores_for_batch(trainer, output, rewards, 2)
    seen = [c[0]["content"] for c in judge.calls[0]["completions"]]
    if first_row_reward == 0.0:  # group (2, 3) all-negative: its local row 3 judged here
        assert seen == ["4", "55", "666"]
        torch.testing.assert_close(scores, torch.tensor([NAN, NAN, 0.9, 0.1, 0.2, 0.3]), equal_nan=True)
    else:  # row 2 was right: group (2, 3) is mixed, its row 3 never judged although its own reward is 0
        assert seen == ["55", "666"]
        torch.testing.assert_close(scores, torch.tensor([NAN, NAN, 0.9, NAN, 0.2, 0.3]), equal_nan=True)
