"""mmGRPO per-call advantages: hand-derived numbers, the official dspy + Arbor numbers, and the edge cases."""

import random

import pytest
import torch

import trl_groupx
from trl_groupx.advantages.mmgrpo import mmgrpo_step_advantages
from trl_groupx.advantages.step_credit import StepBatch, step_to_token_advantages, turn_index_from_tool_mask

from . import mmgrpo_official as official

NAN, INF = float("nan"), float("inf")
EPS = 1e-4  # Arbor's std epsilon


def program(calls):
    """StepBatch of program rollouts: `calls[e]` lists the module of each LM call of rollout e."""
    return StepBatch.from_lists([[0] * len(c) for c in calls], modules=calls)


def adv(rewards, group_size, calls, **kwargs):
    return mmgrpo_step_advantages(torch.tensor(rewards), group_size, program(calls), **kwargs)


def test_catalog_check_two_rollouts_two_modules():
    # 2 program rollouts × (plan, answer), scores 1 and 0, G = 2: two groups of size 2, {plan_0, plan_1} and
    # {answer_0, answer_1}, each holding the program-level scores [1, 0] → mean .5 → ±.5 on both calls.
    calls = [["plan", "answer"], ["plan", "answer"]]
    groups = official.dspy_groups(calls, [1.0, 0.0], 2)
    assert [[(e, m, j) for e, m, j, _ in g] for g in groups] == [[(0, "answer", 0), (1, "answer", 0)],
                                                                 [(0, "plan", 0), (1, "plan", 0)]]
    assert all([r for *_, r in g] == [1.0, 0.0] for g in groups)
    torch.testing.assert_close(adv([1.0, 0.0], 2, calls), torch.tensor([0.5, 0.5, -0.5, -0.5]))
    # mmgrpo_scale: ±.5 / (std([1, 0]) + 1e-4) = ±.5 / (.70711 + 1e-4)
    a = adv([1.0, 0.0], 2, calls, mmgrpo_scale=True)
    torch.testing.assert_close(a, torch.tensor([1, 1, -1, -1]) * 0.5 / (2 ** -0.5 + EPS))


def test_groups_are_module_calls_not_turn_positions():
    # e0 calls plan, plan, answer; e1 calls plan, answer, answer (G = 2, scores 1, 0). Truncate keeps min(2, 1) = 1
    # plan call and min(1, 2) = 1 answer call per rollout: e0's 2nd plan and e1's 2nd answer get 0. The kept calls
    # are compared with the same module's call (e0 turn 2 with e1 turn 1 for answer), ±.5 each.
    a = adv([1.0, 0.0], 2, [["plan", "plan", "answer"], ["plan", "answer", "answer"]])
    torch.testing.assert_close(a, torch.tensor([0.5, 0.0, 0.5, -0.5, -0.5, 0.0]))
    # ragged trains every call: the unmatched 2nd calls are alone in their group (size 1) → 0 as well
    r = adv([1.0, 0.0], 2, [["plan", "plan", "answer"], ["plan", "answer", "answer"]], mmgrpo_grouping="ragged")
    torch.testing.assert_close(r, a)


INTERRUPTED = [["plan", "answer"], ["plan", "answer"], ["plan", "answer"], ["plan"]]  # e3 stopped after plan
SCORES = [1.0, 0.0, 1.0, -1.0]  # e3: format failure, dspy's −1


def test_interrupted_rollout_truncate():
    # plan: all 4 rollouts, mean (1 + 0 + 1 − 1)/4 = .25 → [.75, −.25, .75, −1.25]
    # answer: e3 never called it, min_len 0 → dspy skips the module for this example → 0 on every answer call
    a = adv(SCORES, 4, INTERRUPTED)
    # step order: e0 plan, e0 answer, e1 plan, e1 answer, e2 plan, e2 answer, e3 plan
    torch.testing.assert_close(a, torch.tensor([0.75, 0.0, -0.25, 0.0, 0.75, 0.0, -1.25]))


def test_interrupted_rollout_ragged():
    # answer group = the 3 rollouts that called it, scores [1, 0, 1], mean 2/3 → [1/3, −2/3, 1/3]; plan as above
    a = adv(SCORES, 4, INTERRUPTED, mmgrpo_grouping="ragged")
    torch.testing.assert_close(a, torch.tensor([0.75, 1 / 3, -0.25, -2 / 3, 0.75, 1 / 3, -1.25]))
    # scaled: plan deviations [.75, −.25, .75, −1.25], unbiased var 2.75/3; answer [1/3, −2/3, 1/3], var (6/9)/2
    s = adv(SCORES, 4, INTERRUPTED, mmgrpo_grouping="ragged", mmgrpo_scale=True)
    sp, sa = (2.75 / 3) ** 0.5 + EPS, (1 / 3) ** 0.5 + EPS
    torch.testing.assert_close(s, torch.tensor([0.75 / sp, 1 / 3 / sa, -0.25 / sp, -2 / 3 / sa, 0.75 / sp,
                                                1 / 3 / sa, -1.25 / sp]))


def test_official_ragged_crashes_where_ours_groups_the_callers():
    with pytest.raises(IndexError):
        official.dspy_groups(INTERRUPTED[:3] + [["plan", "answer", "answer"]], SCORES, 4, mode="ragged")
    # with equal call counts ragged and truncate coincide, and match the official ragged groups
    calls = [["plan", "answer"]] * 4
    ref = official.arbor_advantages(official.dspy_groups(calls, SCORES, 4, mode="ragged"), 4)
    ours = adv(SCORES, 4, calls, mmgrpo_grouping="ragged")
    assert ours.tolist() == pytest.approx([ref[(e, m, 0)] for e in range(4) for m in ("plan", "answer")])


def test_all_equal_rewards_give_zero():
    for scale in (False, True):
        a = adv([0.5, 0.5, 0.5, 0.5], 4, INTERRUPTED, mmgrpo_grouping="ragged", mmgrpo_scale=scale)
        assert torch.equal(a, torch.zeros(7))


def test_nan_reward_is_left_out_of_groups_and_lengths():
    # e3 unscored (NaN) and interrupted: it is in no group and does not shorten the answer module, so the answer
    # group is {e0, e1, e2} under truncate too: [1, 0, 1] → [1/3, −2/3, 1/3]; plan {e0, e1, e2} the same numbers.
    a = adv([1.0, 0.0, 1.0, NAN], 4, INTERRUPTED)
    torch.testing.assert_close(a, torch.tensor([1 / 3, 1 / 3, -2 / 3, -2 / 3, 1 / 3, 1 / 3, 0.0]))
    # group size 2 with one NaN: the scored rollout is alone → 0 (and no NaN leaks)
    b = adv([NAN, 1.0, 0.0, 1.0], 2, [["plan", "answer"]] * 4, mmgrpo_scale=True)
    s = 0.5 / (2 ** -0.5 + EPS)
    torch.testing.assert_close(b, torch.tensor([0.0, 0.0, 0.0, 0.0, -s, -s, s, s]))


def test_prompt_groups_do_not_mix_and_step_order_is_free():
    calls = [["plan", "answer"], ["plan"], ["plan", "answer"], ["plan", "answer"]]
    rewards = [1.0, -1.0, 0.0, 1.0]
    # G = 2. Prompt 0: plan {1, −1} → ±1, answer: e1 never called it → 0. Prompt 1: both calls {0, 1} → ∓.5.
    a = adv(rewards, 2, calls)
    torch.testing.assert_close(a, torch.tensor([1.0, 0.0, -1.0, -0.5, -0.5, 0.5, 0.5]))
    steps = program(calls)
    perm = torch.tensor([6, 2, 0, 5, 1, 3, 4])
    shuffled = StepBatch(steps.episode[perm], steps.index[perm], steps.state[perm], steps.reward[perm],
                         module=steps.module[perm])
    torch.testing.assert_close(mmgrpo_step_advantages(torch.tensor(rewards), 2, shuffled), a[perm])


def test_rollout_without_calls_skips_every_module_under_truncate():
    # an empty program rollout (e.g. an empty completion) has min_len 0 for every module → nothing is trained
    calls = [["plan", "answer"], [], ["plan", "answer"], ["plan", "answer"]]
    assert torch.equal(adv([1.0, 0.0, 1.0, 0.0], 4, calls), torch.zeros(6))
    # ragged: the three rollouts that called each module form its group, [1, 1, 0] → [1/3, 1/3, −2/3]
    r = adv([1.0, 0.0, 1.0, 0.0], 4, calls, mmgrpo_grouping="ragged")
    torch.testing.assert_close(r, torch.tensor([1 / 3, 1 / 3, 1 / 3, 1 / 3, -2 / 3, -2 / 3]))


def random_programs(seed, n_groups=3, group_size=4):
    rng = random.Random(seed)
    calls, scores = [], []
    for _ in range(n_groups * group_size):
        calls.append([rng.choice(["plan", "search", "answer"]) for _ in range(rng.randint(1, 5))])
        scores.append(rng.choice([-1.0, 0.0, 0.25, 1.0]))
    return calls, scores


@pytest.mark.parametrize("scale", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_matches_official_code(seed, scale):
    calls, scores = random_programs(seed)
    ref = official.arbor_advantages(official.dspy_groups(calls, scores, 4), 4, scale_rewards=scale)
    ours = adv(scores, 4, calls, mmgrpo_scale=scale)
    expected, e_j = [], {}
    for e, ep in enumerate(calls):
        for m in ep:
            j = e_j.get((e, m), 0)
            e_j[(e, m)] = j + 1
            expected.append(ref.get((e, m, j), 0.0))  # calls the official code does not train: 0
    torch.testing.assert_close(ours, torch.tensor(expected), atol=2e-5, rtol=1e-5)


def test_layout_on_tokens_padding_never_read():
    # two rows: plan (2 tokens), separator (1, tool_mask 0), answer (2) + EOS; the interrupted one: plan + EOS, padding
    steps = program([["plan", "answer"], ["plan"]])
    a = mmgrpo_step_advantages(torch.tensor([1.0, 0.0]), 2, steps, mmgrpo_grouping="ragged")  # plan ±.5, answer 0
    tool_mask = torch.tensor([[1, 1, 0, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
    completion_mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
    tok = step_to_token_advantages(a, steps, turn_index_from_tool_mask(tool_mask, completion_mask))
    torch.testing.assert_close(tok, torch.tensor([[0.5, 0.5, 0, 0, 0, 0], [-0.5, -0.5, -0.5, 0, 0, 0]]))


def test_errors():
    with pytest.raises(ValueError, match="infinite reward"):
        adv([INF, 0.0], 2, [["plan"], ["plan"]])
    with pytest.raises(ValueError, match="step_modules"):
        mmgrpo_step_advantages(torch.tensor([1.0, 0.0]), 2, StepBatch.from_lists([[0], [0]]))
    with pytest.raises(ValueError, match="mmgrpo_grouping"):
        adv([1.0, 0.0], 2, [["plan"], ["plan"]], mmgrpo_grouping="fill")
    with pytest.raises(ValueError, match="one module name per step"):
        StepBatch.from_lists([[0, 0]], modules=[["plan"]])


def test_config_validation():
    kw = dict(output_dir="/tmp/unused", use_cpu=True, bf16=False)
    config = trl_groupx.GRPOConfig(**kw, **trl_groupx.get_variant("mmgrpo").flags)
    assert (config.mmgrpo_grouping, config.mmgrpo_scale, config.loss_type, config.beta) == (
        "truncate", False, "dr_grpo", 0.001)
    with pytest.raises(ValueError, match="mmgrpo_grouping.*'truncate'"):
        trl_groupx.GRPOConfig(**kw, advantage_estimator="mmgrpo", mmgrpo_grouping="fill")
    with pytest.raises(ValueError, match="mmgrpo_scale"):
        trl_groupx.GRPOConfig(**kw, mmgrpo_scale=True)  # the variant is off
