"""LSPO on the tiny model: a cliff group triggers the scaffold (SFT, re-roll), a mixed group does not; the policy's
parameters are untouched by the scaffold's SFT; spliced rows carry the scaffold's truncated log-probs; the adapter is
gone afterwards; the gradient differs from plain GRPO (full and LoRA); a composition with RLOO; construction errors."""

import math

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, generate_first_batch, grads_differ, one_step
from tests.integration.scripted_rewards import FirstCallPattern
from trl_groupx.sampling import lspo_scaffold
from trl_groupx.sampling.lspo import SCAFFOLD_ADAPTER
from trl_groupx.toy import arithmetic_dataset

G = 4  # conftest: num_generations 4, per_device_train_batch_size 8 -> group 0 (rows 0-3) and group 1 (rows 4-7)
_BASE = arithmetic_dataset(64, seed=0)
DATASET = _BASE.add_column("solution", list(_BASE["answer"]))


def _scripted(reroll=(1.0, 1.0, 1.0, 1.0)) -> FirstCallPattern:
    """Odd calls (the batch's generation): group 0 = [1, 0, 0, 0] (mixed), every other group all 0 (cliffs). Even
    calls (the scaffold re-rolls of the cliff slots): `reroll` per row."""
    return FirstCallPattern(lambda texts, **_: [reroll[i % len(reroll)] for i in range(len(texts))], name="scripted")


def _trainer(tmp_path, peft=False, lspo=True, reward=None, **flags):
    flags = {"shuffle_dataset": False, "max_completion_length": 8, **flags}
    if lspo:
        flags.setdefault("rollout_filter", "lspo")
        flags.setdefault("lspo_sft_learning_rate", 1e-3)
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, dataset=DATASET,
                         reward_funcs=reward or _scripted(), **flags)


class Spy:
    def __init__(self, monkeypatch, name):
        self.calls, self.results = [], []
        original = getattr(lspo_scaffold, name)

        def wrapped(*args, **kwargs):
            self.calls.append((args, kwargs))
            result = original(*args, **kwargs)
            self.results.append(result)
            return result

        monkeypatch.setattr(lspo_scaffold, name, wrapped)


@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
def test_cliff_group_is_scaffolded_and_spliced(tmp_path, monkeypatch, peft):
    fit, reroll, logps = (Spy(monkeypatch, n) for n in ("fit_scaffold", "_reroll", "_scaffold_logps"))
    trainer = _trainer(tmp_path, peft, lspo_sft_steps=2)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    batch, output = generate_first_batch(trainer)
    # one SFT call, on group 1's (prompt, solution) only: the mixed group 0 is never scaffolded
    assert len(fit.calls) == 1
    prompts, targets = fit.calls[0][0][2], fit.calls[0][0][3]
    assert prompts == [batch[4]["prompt"]]
    tok = trainer.processing_class
    assert targets == [tok(batch[4]["solution"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]]
    assert fit.results[0][1] < fit.results[0][0]  # the scaffold's SFT moved it: lower loss on the second step
    # one re-roll call, of the 4 cliff slots (rows 4-7), one completion each
    assert len(reroll.calls) == 1 and reroll.calls[0][0][2] == [4, 5, 6, 7]
    # the policy is unchanged by the scaffold's SFT, and the adapter is gone
    after = dict(trainer.model.named_parameters())
    assert before.keys() == after.keys()
    assert all(torch.equal(before[n], after[n]) for n in before)
    assert all(p.grad is None for p in after.values())  # the SFT backpropagated into the scaffold only
    assert not any(SCAFFOLD_ADAPTER in n for n in after)
    if peft:
        assert SCAFFOLD_ADAPTER not in trainer.model.peft_config and trainer.model.active_adapter == "default"
        assert all(p.requires_grad for n, p in after.items() if "lora_" in n)
    # all 4 re-rolls succeed; at most G - 1 = 3 are spliced (rows 4, 5, 6), row 7 keeps the policy's failure
    assert trainer._rewards_per_func[:, 0].tolist() == [1.0, 0, 0, 0, 1.0, 1.0, 1.0, 0.0]
    completions = reroll.results[0]
    for k, row in enumerate((4, 5, 6)):
        n = len(completions[k])
        assert output["completion_ids"][row, :n].tolist() == completions[k]
        # behaviour log-probs: max(scaffold, current - log C) with C = 1, i.e. the ratio min(pi/pi_s, 1)
        sub = {key: output[key][row:row + 1] for key in ("prompt_ids", "prompt_mask", "completion_ids",
                                                          "completion_mask")}
        current, _ = trainer._rollout_logps(sub, trainer.model, compute_entropy=False)
        scaffold = logps.results[0][k, :n]
        mask = output["completion_mask"][row, :n]
        expected = torch.maximum(scaffold, current[0, :n]) * mask
        torch.testing.assert_close(output["old_per_token_logps"][row, :n], expected)
        assert not torch.allclose(scaffold * mask, current[0, :n] * mask)  # the scaffold is another policy
    # advantages: group 1 = [1, 1, 1, 0] after the splice -> GRPO's (r - mean) / (std + 1e-4)
    r = torch.tensor([1.0, 1.0, 1.0, 0.0])
    torch.testing.assert_close(output["advantages"][4:8], (r - r.mean()) / (r.std() + 1e-4))
    metrics = trainer._metrics["train"]
    assert metrics["groupx/lspo_cliff_groups"] == [1.0] and metrics["groupx/lspo_spliced_rows"] == [3.0]


def test_mixed_groups_only_do_not_trigger_the_scaffold(tmp_path, monkeypatch):
    fit, reroll = Spy(monkeypatch, "fit_scaffold"), Spy(monkeypatch, "_reroll")

    def mixed(completions, **kwargs):
        return [float(i % 2) for i in range(len(completions))]

    trainer = _trainer(tmp_path, reward=mixed)
    generate_first_batch(trainer)
    assert fit.calls == [] and reroll.calls == []
    assert trainer._metrics["train"]["groupx/lspo_cliff_groups"] == [0.0]


def test_failed_rerolls_are_not_spliced(tmp_path):
    trainer = _trainer(tmp_path, reward=_scripted(reroll=(0.0, 0.0, 0.0, 0.0)))
    _, output = generate_first_batch(trainer)
    assert trainer._rewards_per_func[:, 0].tolist() == [1.0, 0, 0, 0, 0, 0, 0, 0]
    assert output["advantages"][4:].abs().max() < 1e-6
    assert "old_per_token_logps" not in output  # nothing spliced: TRL's on-policy batch as it was


def test_truncation_cap_above_one_keeps_the_scaffold_log_probs(tmp_path, monkeypatch):
    logps = Spy(monkeypatch, "_scaffold_logps")
    trainer = _trainer(tmp_path, lspo_is_cap=1e6, reward=_scripted(reroll=(1.0, 0.0, 0.0, 0.0)))
    _, output = generate_first_batch(trainer)
    n = int(output["completion_mask"][4].sum())
    # log C = 13.8: current - log C is below every scaffold log-prob of the tiny model here, so b = log pi_s
    assert (logps.results[0][0, :n] > -math.log(1e6) - 20).all()
    torch.testing.assert_close(output["old_per_token_logps"][4, :n], logps.results[0][0, :n])


@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
def test_gradient_differs_from_plain_grpo(tmp_path, peft):
    # plain GRPO: group 1 all fail -> no signal; LSPO: group 1 trains toward the spliced scaffold re-rolls
    _, g_lspo, _ = one_step(_trainer(tmp_path, peft))
    _, g_plain, _ = one_step(_trainer(tmp_path, peft, lspo=False))
    assert grads_differ(g_lspo, g_plain)


def test_composes_with_rloo(tmp_path):
    trainer = _trainer(tmp_path, advantage_estimator="rloo")
    _, output = generate_first_batch(trainer)
    # RLOO on group 1 = [1, 1, 1, 0]: A_i = r_i - mean of the other three -> [1/3, 1/3, 1/3, -1]
    torch.testing.assert_close(output["advantages"][4:8], torch.tensor([1 / 3, 1 / 3, 1 / 3, -1.0]))


def test_construction_errors(tmp_path):
    with pytest.raises(ValueError, match="lspo_column='missing'"):
        _trainer(tmp_path, lspo_column="missing")
    with pytest.raises(ValueError, match="rollout_func"):
        _trainer(tmp_path, rollout_func=lambda prompts, trainer: {})


def test_empty_solution_raises(tmp_path):
    dataset = _BASE.add_column("solution", [""] * len(_BASE))
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, dataset=dataset,
                            reward_funcs=_scripted(), shuffle_dataset=False, rollout_filter="lspo")
    with pytest.raises(ValueError, match="no ground-truth solution"):
        generate_first_batch(trainer)


def test_kept_old_and_reference_log_probs_and_saved_adapter(tmp_path, monkeypatch):
    # steps_per_generation 2 with gradient_accumulation_steps 1: TRL keeps old log-probs; beta > 0: reference ones.
    # Generation batch 16 -> 4 groups: group 0 mixed, groups 1-3 cliffs; re-rolls [1, 0, 0, 0] -> rows 4, 8, 12.
    logps = Spy(monkeypatch, "_scaffold_logps")
    trainer = _trainer(tmp_path, True, steps_per_generation=2, beta=0.04, reward=_scripted(reroll=(1.0, 0.0, 0.0, 0.0)))
    _, output = generate_first_batch(trainer)
    rows = [4, 8, 12]
    assert trainer._rewards_per_func[:, 0].tolist() == [1.0, 0, 0, 0] + [1.0, 0, 0, 0] * 3
    index = torch.tensor(rows)
    sub = {k: output[k][index] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}
    mask = sub["completion_mask"]
    current, _ = trainer._rollout_logps(sub, trainer.model, compute_entropy=False)
    with trainer.model.disable_adapter():  # LoRA: the reference is the base model
        ref, _ = trainer._rollout_logps(sub, trainer.model, compute_entropy=False)
    torch.testing.assert_close(output["ref_per_token_logps"][index], ref * mask)
    # re-rolled slots 4-15 in row order: rows 4, 8, 12 are slots 0, 4, 8
    scaffold = logps.results[0][[0, 4, 8]]
    T = mask.size(1)
    scaffold = torch.nn.functional.pad(scaffold, (0, max(0, T - scaffold.size(1))))[:, :T]
    torch.testing.assert_close(output["old_per_token_logps"][index], torch.maximum(scaffold, current) * mask)
    trainer.model.save_pretrained(tmp_path / "saved")  # the scaffold is deleted before any checkpoint
    assert not (tmp_path / "saved" / SCAFFOLD_ADAPTER).exists()
    assert [p.name for p in (tmp_path / "saved").iterdir() if p.is_dir()] == []


def test_evaluation_batches_are_left_as_generated(tmp_path, monkeypatch):
    fit, reroll = Spy(monkeypatch, "fit_scaffold"), Spy(monkeypatch, "_reroll")
    trainer = _trainer(tmp_path)
    trainer.model.eval()
    torch.manual_seed(0)
    batch = next(iter(trainer.get_train_dataloader()))
    trainer._generate_and_score_completions(batch)
    assert fit.calls == [] and reroll.calls == []
    assert trainer._rewards_per_func[:, 0].tolist() == [1.0, 0, 0, 0, 0, 0, 0, 0]  # the cliff group stays a cliff
    assert trainer.model.training is False
