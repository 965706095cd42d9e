"""EDGE-GRPO Guided Error Correction on the tiny model: the corrected responses in the batch, their re-scored rewards
and recomputed advantages, the gradient against EDA alone (full and LoRA), plain-text prompts, evaluation,
construction errors."""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, generate_first_batch, grads_differ, one_step
from tests.integration.scripted_rewards import FirstCallPattern
from trl_groupx.sampling.edge_grpo_gec import (
    ANSWER,
    REFLECT,
    SOLUTION,
    answer_suffix,
    assign_branches,
    branch_uniforms,
    reflect_prefix,
)
from trl_groupx.toy import arithmetic_dataset

G = 4  # conftest: num_generations 4, per_device_train_batch_size 8 -> 2 groups per generation call
_BASE = arithmetic_dataset(64, seed=0)
DATASET = _BASE.add_column("solution", [f"={a}" for a in _BASE["answer"]])
TEMPLATE = "!{answer}"  # short stand-in for the official text: the tiny model has 64 positions, max_completion 8
CUE = "?"  # short stand-in for the official reflect cue
# seed 0, step 0, official shares: the branch of each of the 8 rows (unit-tested draw)
BRANCHES = assign_branches(branch_uniforms(8, 0, 0), 0.25, 0.25).tolist()
assert BRANCHES == [SOLUTION, REFLECT, ANSWER, ANSWER, SOLUTION, REFLECT, SOLUTION, REFLECT]


def _solution_or_templated_answer(texts, answer, solution, **_):
    """Re-scoring of corrected rows: 1 for the exact solution, 0.5 for a response ending with the templated answer,
    else 0."""
    return [1.0 if t == s else 0.5 if t.endswith(answer_suffix(a, TEMPLATE)) else 0.0
            for t, a, s in zip(texts, answer, solution)]


def _reward() -> FirstCallPattern:
    """Generation call: row 0 = 1 (correct), every other row 0. Later calls: `_solution_or_templated_answer`."""
    return FirstCallPattern(_solution_or_templated_answer)


def _trainer(tmp_path, peft=False, gec=True, reward=None, dataset=DATASET, **flags):
    flags = {"shuffle_dataset": False, "max_completion_length": 8, "edge_grpo_gec": gec, **flags}
    if gec:
        flags.setdefault("edge_grpo_gec_target_reward", 1.0)
        flags.setdefault("edge_grpo_gec_answer_template", TEMPLATE)
        flags.setdefault("edge_grpo_gec_reflect_cue", CUE)
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, dataset=dataset,
                         reward_funcs=reward or _reward(), **flags)


class GenerateSpy:
    """Records every `_generate_single_turn` call's prompt ids and the completions it returned."""

    def __init__(self, trainer):
        self.original, self.calls = trainer._generate_single_turn, []
        trainer._generate_single_turn = self

    def __call__(self, prompt_ids, *args, **kwargs):
        completions, logprobs = self.original(prompt_ids, *args, **kwargs)
        self.calls.append(([list(p) for p in prompt_ids], [list(c) for c in completions]))
        return completions, logprobs


def _group_formula(r):
    r = r.view(-1, G)
    return ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).flatten()


def _real(output, row):
    return output["completion_ids"][row][output["completion_mask"][row].bool()].tolist()


@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
def test_corrected_responses_are_in_the_batch_and_rescored(tmp_path, peft):
    reward = _reward()
    trainer = _trainer(tmp_path, peft, reward=reward)
    spy = GenerateSpy(trainer)
    plain = _trainer(tmp_path, peft, gec=False, reward=_reward())
    batch, output = generate_first_batch(trainer)
    _, plain_output = generate_first_batch(plain)
    tok = trainer.processing_class
    eos = tok.eos_token_id
    eos_ids = [*trainer.eos_token_ids, tok.pad_token_id]
    cue_ids = tok(CUE, add_special_tokens=False)["input_ids"]
    # the rollouts, then one reflect call: rows 1, 5, 7 continued from prompt + their response + cue
    assert len(spy.calls) == 2 and len(spy.calls[1][0]) == 3
    reflect_calls = dict(zip([1, 5, 7], zip(*spy.calls[1])))
    for row in range(8):
        sampled = _real(plain_output, row)
        if row == 0:  # the correct row: as generated
            assert _real(output, row) == sampled
        elif BRANCHES[row] == REFLECT:  # sampled tokens without EOS (cut) + cue + the policy's continuation, cut
            prefix = reflect_prefix(sampled, cue_ids, eos_ids, 8)
            assert prefix[-len(cue_ids):] == cue_ids and len(prefix) <= 7
            prompt = plain_output["prompt_ids"][row][plain_output["prompt_mask"][row].bool()].tolist()
            called_with, continuation = reflect_calls[row]
            assert called_with == prompt + prefix, row
            assert continuation and _real(output, row) == (prefix + continuation)[:8], row
        elif BRANCHES[row] == ANSWER:  # sampled tokens without their EOS, cut to leave room, + suffix + EOS
            kept = sampled[:-1] if sampled and sampled[-1] == eos else sampled
            tail = tok(answer_suffix(batch[row]["answer"], TEMPLATE), add_special_tokens=False)["input_ids"] + [eos]
            assert _real(output, row) == kept[: 8 - len(tail)] + tail, row
        else:  # the reference solution + EOS
            assert _real(output, row) == tok(batch[row]["solution"], add_special_tokens=False)["input_ids"] + [eos]
    # one re-scoring call with the seven corrected rows 1..7 in row order (4 and 6: the solution)
    assert len(reward.calls) == 2 and len(reward.calls[1]) == 7
    assert [reward.calls[1][3], reward.calls[1][5]] == [batch[4]["solution"], batch[6]["solution"]]
    r = trainer._rewards_per_func[:, 0]
    assert r.tolist() == [1.0, 0.0, 0.5, 0.5, 1.0, 0.0, 1.0, 0.0]
    torch.testing.assert_close(output["advantages"], _group_formula(r))  # GRPO on the re-scored rewards
    assert output["num_items_in_batch"] == (output["completion_mask"]).sum()
    metrics = trainer._metrics["train"]
    assert metrics["groupx/gec_selected"] == [7.0] and metrics["groupx/gec_corrected"] == [7.0]
    assert metrics["groupx/gec_reflected"] == [3.0]


def test_reflect_branch_budget_and_cut(tmp_path):
    # every selected row reflects; budget 2 new tokens: each continuation has at most 2 tokens
    trainer = _trainer(tmp_path, edge_grpo_gec_answer_share=0.0, edge_grpo_gec_solution_share=0.0,
                       edge_grpo_gec_reflect_max_new_tokens=2)
    spy = GenerateSpy(trainer)
    _, output = generate_first_batch(trainer)
    prompts, continuations = spy.calls[1]
    assert len(prompts) == 7 and all(1 <= len(c) <= 2 for c in continuations)
    assert trainer._metrics["train"]["groupx/gec_reflected"] == [7.0]
    assert (output["completion_mask"].sum(1) <= 8).all()


@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
def test_full_method_gradient_differs_from_eda_alone(tmp_path, peft):
    # EDGE-GRPO = EDA (token_weighting="edge_grpo") + GEC; EDA alone trains on the uncorrected batch
    loss, g_full, inputs = one_step(_trainer(tmp_path, peft, token_weighting="edge_grpo"))
    _, g_eda, _ = one_step(_trainer(tmp_path, peft, gec=False, token_weighting="edge_grpo"))
    assert torch.isfinite(loss) and grads_differ(g_full, g_eda)


def test_corrected_row_log_probs_are_recomputed(tmp_path):
    # steps_per_generation 2: TRL keeps old log-probs; beta > 0: reference ones. Generation batch 16 rows.
    trainer = _trainer(tmp_path, steps_per_generation=2, beta=0.04)
    _, output = generate_first_batch(trainer)
    branches = assign_branches(branch_uniforms(16, 0, 0), 0.25, 0.25)
    rows = list(range(1, 16))  # every row but the first is below the target, each corrected (any branch)
    assert (branches[1:] == REFLECT).any()
    index = torch.tensor(rows)
    sub = {k: output[k][index] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}
    mask = sub["completion_mask"]
    current, _ = trainer._rollout_logps(sub, trainer.model, compute_entropy=False)
    ref, _ = trainer._rollout_logps(sub, trainer.ref_model, compute_entropy=False)
    torch.testing.assert_close(output["old_per_token_logps"][index], current * mask)
    torch.testing.assert_close(output["ref_per_token_logps"][index], ref * mask)


def test_plain_text_prompts(tmp_path):
    dataset = DATASET.map(lambda x: {"prompt": x["prompt"][0]["content"]})
    reward = _reward()
    trainer = _trainer(tmp_path, reward=reward, dataset=dataset, edge_grpo_gec_answer_share=1.0,
                       edge_grpo_gec_solution_share=0.0)
    batch, output = generate_first_batch(trainer)
    assert all(isinstance(t, str) for t in reward.calls[1]) and len(reward.calls[1]) == 7
    assert all(t.endswith(answer_suffix(batch[i + 1]["answer"], TEMPLATE)) for i, t in enumerate(reward.calls[1]))
    assert trainer._rewards_per_func[:, 0].tolist() == [1.0] + [0.5] * 7


def test_long_prompts_are_not_corrected(tmp_path):
    trainer = _trainer(tmp_path, edge_grpo_gec_max_prompt_tokens=1)
    _, output = generate_first_batch(trainer)
    assert trainer._metrics["train"]["groupx/gec_selected"] == [0.0]
    assert trainer._rewards_per_func[:, 0].tolist() == [1.0] + [0.0] * 7


def test_evaluation_never_corrects(tmp_path):
    trainer = _trainer(tmp_path)
    trainer.model.eval()
    torch.manual_seed(0)
    trainer._generate_and_score_completions([dict(DATASET[i]) for i in range(2) for _ in range(G)])
    assert "groupx/gec_selected" not in trainer._metrics["eval"]


def test_row_without_a_reference_fails_clearly(tmp_path):
    dataset = _BASE.add_column("solution", [""] * len(_BASE))
    trainer = _trainer(tmp_path, dataset=dataset, edge_grpo_gec_solution_share=1.0, edge_grpo_gec_answer_share=0.0)
    with pytest.raises(ValueError, match="no reference in column 'solution'"):
        generate_first_batch(trainer)


def _answer_only_reward(completions, answer, **kwargs):
    return [0.0] * len(completions)


def test_missing_column_fails_at_construction(tmp_path):
    with pytest.raises(ValueError, match="edge_grpo_gec_solution_column='solution'.*lacks.*add the column or set"):
        _trainer(tmp_path, dataset=_BASE, reward=_answer_only_reward)


def test_rollout_func_is_refused(tmp_path):
    def rollout_func(prompts, trainer):  # never called: construction fails first
        raise AssertionError

    with pytest.raises(ValueError, match="edge_grpo_gec=True.*rollout_func"):
        build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, dataset=DATASET,
                      reward_funcs=_reward(), rollout_func=rollout_func, edge_grpo_gec=True)
