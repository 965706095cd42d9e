"""VeriGate step credit (verigate_step): mixed groups keep their sequence advantages on every token; degenerate groups
get the group-normalised reward-to-go of their PRM step scores on each step's tokens; derivations in comments. No
official code (arXiv:2605.30451)."""

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

import trl_groupx
from trl_groupx.contracts import TokenContext
from trl_groupx.rewards.arithmetic_step_prm import arithmetic_step_prm
from trl_groupx.token_weights.verigate_step import (
    degenerate_groups,
    group_step_zscores,
    prm_steps_for_batch,
    register_step_prm,
    reward_to_go,
    step_char_spans,
    token_steps,
)
from trl_groupx.token_weights.verigate_step import verigate_step_token_advantages as vgs
from trl_groupx.toy import load_tiny_tokenizer

NAN = float("nan")
EPS = 1e-4
INF = math.inf


def test_steps_end_after_each_delimiter_and_eos_joins_the_last_step():
    assert step_char_spans("12\n\n34\n\n5", "\n\n") == [(0, 4), (4, 8), (8, INF)]
    assert step_char_spans("ab\n\n", "\n\n") == [(0, INF)]  # ends on the delimiter: no empty trailing step
    assert step_char_spans("abc", "\n\n") == [(0, INF)]  # no delimiter: one step
    assert step_char_spans("", "\n\n") == []
    # token texts "1","2","\n\n","3","4\n","\n5","" (EOS): offsets 0,1,2,4,5,7,9; "\n5" straddles the second
    # boundary (8) and belongs to the step of its first character (1); the EOS (no text) to the last step
    steps, texts = token_steps(["1", "2", "\n\n", "3", "4\n", "\n5", ""], "\n\n")
    assert steps == [0, 0, 0, 1, 1, 1, 2] and texts == ["12\n\n", "34\n\n", "5"]
    assert token_steps([""], "\n\n") == ([-1], [])  # an empty completion (EOS only) has no step


def test_reward_to_go_hand_derived():
    # [1, 0, 1] → [2, 1, 1]; [.5, .5, ·] → [1, .5, ·]
    out = reward_to_go(torch.tensor([[1.0, 0.0, 1.0], [0.5, 0.5, NAN]]))
    torch.testing.assert_close(out, torch.tensor([[2.0, 1.0, 1.0], [1.0, 0.5, NAN]]), equal_nan=True)
    with pytest.raises(ValueError, match="left-aligned"):
        reward_to_go(torch.tensor([[1.0, NAN, 1.0]]))


def test_group_normalisation_pools_every_step_of_the_group():
    # R = {2, 1, 1 | 1, .5}: mean 5.5/5 = 1.1, squared deviations .81+.01+.01+.01+.36 = 1.2, unbiased var 1.2/4 = .3
    to_go = torch.tensor([[2.0, 1.0, 1.0], [1.0, 0.5, NAN]])
    s = math.sqrt(0.3) + EPS
    expected = torch.tensor([[0.9, -0.1, -0.1], [-0.1, -0.6, 0.0]]) / s
    torch.testing.assert_close(group_step_zscores(to_go, torch.tensor([True, True]), 2), expected)
    # a row not taking part is neither normalised nor counted: one row's 3 steps {2, 1, 1}, mean 4/3, var 1/3
    out = group_step_zscores(to_go, torch.tensor([True, False]), 2)
    s1 = math.sqrt(1 / 3) + EPS
    torch.testing.assert_close(out, torch.tensor([[2 / 3, -1 / 3, -1 / 3], [0.0, 0.0, 0.0]]) / s1)


def ctx_for(rewards, mask, step_ids, step_scores, group_size):
    return TokenContext(completion_mask=mask, group_size=group_size, rewards=rewards, prm_step_ids=step_ids,
                        prm_step_scores=step_scores)


def test_catalog_check_mixed_group_is_grpo_degenerate_group_gets_normalised_reward_to_go():
    # group 0 [0, 1, 0, 1] mixed: every real token carries the incoming (GRPO) advantage; its step entries are
    # garbage and never read. Group 1 [0, 0, 0, 0] degenerate, steps per row (T = 4 tokens, row 7 padded after 2):
    #   row 4: tokens in steps 0,0,1,1  scores [1, 0]  → R [1, 0]
    #   row 5: tokens in steps 0,1,1,1  scores [1, 1]  → R [2, 1]
    #   row 6: tokens in steps 0,0,0,0  scores [0]     → R [0]
    #   row 7: tokens in steps 0,1,·,·  scores [0, 1]  → R [1, 1]
    # pooled R {1,0,2,1,0,1,1}: mean 6/7, squared deviations (1/7)²·4 + (6/7)²·2 + (8/7)² = (4+72+64)/49 = 140/49,
    # unbiased var 140/49/6 = 10/21
    rewards = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    mask = torch.ones(8, 4)
    mask[7, 2:] = 0
    advantages = torch.tensor([-0.8, 0.8, -0.8, 0.8, 5.0, 5.0, 5.0, 5.0])
    step_ids = torch.tensor([[0, 0, 0, 0]] * 4 + [[0, 0, 1, 1], [0, 1, 1, 1], [0, 0, 0, 0], [0, 1, 0, 0]])
    scores = torch.tensor([[9.0, 9.0]] * 4 + [[1.0, 0.0], [1.0, 1.0], [0.0, NAN], [0.0, 1.0]])
    out = vgs(advantages, ctx_for(rewards, mask, step_ids, scores, 4))
    assert torch.equal(out[:4], advantages[:4, None].expand(4, 4))  # exactly the sequence advantages
    m, s = 6 / 7, math.sqrt(10 / 21) + EPS

    def z(r):
        return (r - m) / s

    expected = torch.tensor([[z(1), z(1), z(0), z(0)], [z(2), z(1), z(1), z(1)], [z(0)] * 4, [z(1), z(1), 0.0, 0.0]])
    torch.testing.assert_close(out[4:], expected)


def test_padding_never_read():
    # padding positions carry step ids pointing at real steps; their output is still 0
    rewards = torch.zeros(2)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    step_ids = torch.tensor([[0, 1, 0], [0, 0, 1]])
    scores = torch.tensor([[1.0, 1.0], [0.5, NAN]])  # R {2, 1 | .5}: none at the mean 7/6
    out = vgs(torch.zeros(2), ctx_for(rewards, mask, step_ids, scores, 2))
    assert (out[mask == 0] == 0).all() and (out[mask == 1] != 0).all()
    mixed = vgs(torch.tensor([1.0, -1.0]), ctx_for(torch.tensor([1.0, 0.0]), mask, step_ids, scores, 2))
    assert torch.equal(mixed, torch.tensor([[1.0, 1.0, 0.0], [-1.0, 0.0, 0.0]]))


def test_nan_rewards_and_unscored_rows_get_zero_and_stay_out_of_the_statistics():
    # degenerate group [0, NaN, 0, 0] (NaN unscored: still degenerate on its scored rows); one step per row;
    # row 1 (NaN reward) and row 3 (PRM returned None → NaN) get 0; rows 0, 2: R {.2, .6} → ∓.2/(sqrt(.08)+1e-4)
    rewards = torch.tensor([0.0, NAN, 0.0, 0.0])
    mask = torch.ones(4, 2)
    step_ids = torch.zeros(4, 2, dtype=torch.long)
    scores = torch.tensor([[0.2], [0.9], [0.6], [NAN]])
    out = vgs(torch.zeros(4), ctx_for(rewards, mask, step_ids, scores, 4))
    s = math.sqrt(0.08) + EPS
    torch.testing.assert_close(out, torch.tensor([[-0.2 / s] * 2, [0.0] * 2, [0.2 / s] * 2, [0.0] * 2]))
    assert degenerate_groups(torch.tensor([0.0, NAN, NAN, NAN]), 4).tolist() == [True]  # one scored: degenerate


def test_group_size_two_one_and_all_equal():
    # G=2, one step each, R {.2, .8}: mean .5, unbiased std sqrt(.18) → ∓.3/(sqrt(.18)+1e-4)
    out = vgs(torch.zeros(2), ctx_for(torch.ones(2), torch.ones(2, 1), torch.zeros(2, 1, dtype=torch.long),
                                      torch.tensor([[0.2], [0.8]]), 2))
    a = 0.3 / (math.sqrt(0.18) + EPS)
    torch.testing.assert_close(out, torch.tensor([[-a], [a]]))
    # all steps alike: no signal
    same = vgs(torch.zeros(2), ctx_for(torch.ones(2), torch.ones(2, 1), torch.zeros(2, 1, dtype=torch.long),
                                       torch.tensor([[0.5], [0.5]]), 2))
    assert torch.equal(same, torch.zeros(2, 1))
    with pytest.raises(ValueError, match="at least two responses"):
        vgs(torch.zeros(2), ctx_for(torch.zeros(2), torch.ones(2, 1), None, None, 1))
    with pytest.raises(ValueError, match="infinite reward"):
        vgs(torch.zeros(2), ctx_for(torch.tensor([0.0, INF]), torch.ones(2, 1), None, None, 2))


def test_without_step_scores_degenerate_groups_keep_the_incoming_advantages():
    # evaluation / no degenerate group: the trainer passes no step data; the output is the sequence advantages
    adv = torch.tensor([0.5, -0.5, 0.0, 0.0])
    out = vgs(adv, ctx_for(torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.ones(4, 3), None, None, 2))
    assert torch.equal(out, adv[:, None].expand(4, 3))


def test_toy_step_prm_scores_steps_up_to_the_first_error():
    # answer "25": steps "2" | "5" → prefixes "2", "25" both right; "2" | "9" → "29" wrong from step 2
    out = arithmetic_step_prm(steps=[["2", "5"], ["2", "9"], ["7"], []], answer=["25", "25", "25", "25"])
    assert out == [[1.0, 1.0], [1.0, 0.0], [0.0], []]
    assert arithmetic_step_prm(steps=[["2"]], answer=[None]) == [None]


def config(**kwargs):
    return trl_groupx.GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, **kwargs)


def test_config_refusals_name_the_flag():
    with pytest.raises(ValueError, match="verigate_step_prm is not set"):
        config(token_weighting="verigate_step")
    with pytest.raises(ValueError, match="verigate_step_prm='nope' is not registered"):
        config(token_weighting="verigate_step", verigate_step_prm="nope")
    with pytest.raises(ValueError, match="verigate_step_delimiter must be a non-empty string"):
        config(token_weighting="verigate_step", verigate_step_prm="arithmetic_steps", verigate_step_delimiter="")
    with pytest.raises(ValueError, match="belongs to variant 'verigate_step'"):
        config(verigate_step_delimiter="\n")
    cfg = config(token_weighting="verigate_step", verigate_step_prm="arithmetic_steps")
    assert cfg.active_variants() == {"token_weights": "verigate_step"}


# ---- trainer glue: the PRM sees the degenerate groups' completions only, split into steps ----------------------


class RecordingPRM:
    def __init__(self):
        self.calls = []

    def __call__(self, prompts, completions, steps, **kwargs):
        self.calls.append(steps)
        return [[0.1 * len(s) for s in row] for row in steps]


def fake_trainer(texts, training=True):
    tokenizer = load_tiny_tokenizer()
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    pad = tokenizer("|", add_special_tokens=False)["input_ids"][0]  # a delimiter character: read, it would split
    width = max(len(i) for i in ids)
    output = {"completion_ids": torch.tensor([i + [pad] * (width - len(i)) for i in ids]),
              "completion_mask": torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in ids])}
    trainer = SimpleNamespace(
        args=SimpleNamespace(verigate_step_delimiter="|", verigate_step_prm="recording"),
        model=SimpleNamespace(training=training), _metrics=defaultdict(lambda: defaultdict(list)),
        accelerator=SimpleNamespace(process_index=0, num_processes=1, device="cpu"),
        _rollout_inputs=[{"prompt": "p", "answer": "1"}] * len(texts), processing_class=tokenizer, state=None,
    )
    return trainer, output


def test_prm_called_on_degenerate_groups_only_padding_never_decoded():
    prm = RecordingPRM()
    register_step_prm("recording", prm)
    # G=2: group 0 mixed [1, 0]; group 1 degenerate [0, 0] with "ab|c" (2 steps) and "d" (padded with '|')
    trainer, output = fake_trainer(["x|y", "zz", "ab|c", "d"])
    step_ids, scores = prm_steps_for_batch(trainer, output, torch.tensor([1.0, 0.0, 0.0, 0.0]), 2)
    assert prm.calls == [[["ab|", "c"], ["d"]]]
    assert step_ids.tolist() == [[-1, -1, -1, -1], [-1, -1, -1, -1], [0, 0, 0, 1], [0, -1, -1, -1]]
    torch.testing.assert_close(scores, torch.tensor([[NAN, NAN], [NAN, NAN], [0.3, 0.1], [0.1, NAN]]), equal_nan=True)
    # no degenerate group, or evaluation: the PRM is not called
    prm.calls.clear()
    assert prm_steps_for_batch(trainer, output, torch.tensor([1.0, 0.0, 0.0, 1.0]), 2) == (None, None)
    trainer.model.training = False
    assert prm_steps_for_batch(trainer, output, torch.tensor([0.0, 0.0, 0.0, 0.0]), 2) == (None, None)
    assert prm.calls == []


def test_prm_with_the_wrong_number_of_step_scores_is_refused():
    register_step_prm("recording", lambda steps, **kwargs: [[1.0] for _ in steps])
    trainer, output = fake_trainer(["a|b", "c"])
    with pytest.raises(ValueError, match="returned 1 step scores for a completion of 2 steps"):
        prm_steps_for_batch(trainer, output, torch.zeros(2), 2)
