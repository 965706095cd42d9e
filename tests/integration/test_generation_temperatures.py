"""`generation_temperatures` on the tiny model: completion j of every prompt is drawn at t_j by TRL's own generator
(one call per temperature, rows put back in order), with and without micro sampling groups; it trains (full,
LoRA) and composes with MDP-GRPO's advantages and asymmetric KL."""

import pytest
import torch
import trl

import trl_groupx
from tests.conftest import build_trainer, one_step

TEMPS = [1e-4, 1.0, 1.0, 1.5]  # completion 0 of each prompt: practically greedy


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft, **flags)


@pytest.fixture
def calls(monkeypatch):
    """(number of rows, temperature) of every call of TRL's `_generate_single_turn`."""
    recorded, real = [], trl.GRPOTrainer._generate_single_turn

    def spy(self, prompt_ids, *args, **kwargs):
        recorded.append((len(prompt_ids), self.generation_config.temperature))
        return real(self, prompt_ids, *args, **kwargs)

    monkeypatch.setattr(trl.GRPOTrainer, "_generate_single_turn", spy)
    return recorded


def _greedy(trainer, prompt_ids):
    config = trainer.generation_config.__class__.from_dict(trainer.generation_config.to_dict())
    config.do_sample = False
    config.temperature = config.top_p = config.top_k = None
    saved, trainer.generation_config = trainer.generation_config, config
    try:
        completions, _ = trl.GRPOTrainer._generate_single_turn(trainer, prompt_ids, None, {}, 1)
    finally:
        trainer.generation_config = saved
    return completions


@pytest.mark.parametrize("micro", [None, 3])
def test_each_completion_index_is_sampled_at_its_temperature(tmp_path, calls, micro):
    trainer = ours(tmp_path, generation_temperatures=TEMPS, generation_micro_group_size=micro)
    trainer.model.train()
    torch.manual_seed(0)
    batch = next(iter(trainer.get_train_dataloader()))
    prompts = [x["prompt"] for x in batch]
    prompt_ids, _, _ = trainer._tokenize_prompts(prompts)
    completions, _ = trainer._generate_single_turn(prompt_ids, None, {}, 4)
    # 8 rows = 2 prompts x 4: three temperatures → three generation passes (2, 4, 2 rows; micro chunks of ≤ 3)
    by_temp = {}
    for rows, temperature in calls:
        by_temp[temperature] = by_temp.get(temperature, 0) + rows
    assert by_temp == {1e-4: 2, 1.0: 4, 1.5: 2}
    assert trainer.generation_config.temperature == trainer.args.temperature  # restored
    calls.clear()
    greedy = _greedy(trainer, [prompt_ids[0], prompt_ids[4]])
    assert [completions[0], completions[4]] == greedy  # rows 0 and 4 (completion 0) got t = 1e-4
    assert len(completions) == 8 and all(isinstance(c, list) for c in completions)


@pytest.mark.parametrize("peft", [False, True])
def test_trains_with_mdp_grpo_and_asymmetric_kl(tmp_path, calls, peft):
    trainer = ours(tmp_path, peft, generation_temperatures=[0.1, 0.4, 0.7, 1.0], advantage_estimator="mdp_grpo",
                   beta=0.01, beta_negative=0.025)
    _, grads, inputs = one_step(trainer)
    assert sorted(t for _, t in calls) == [0.1, 0.4, 0.7, 1.0]
    assert all(torch.isfinite(g).all() for g in grads.values()) and any(g.abs().sum() > 0 for g in grads.values())


def test_evaluation_with_another_group_size_samples_at_temperature(tmp_path, calls):
    trainer = ours(tmp_path, generation_temperatures=TEMPS, num_generations_eval=2)
    trainer.model.eval()
    prompt_ids, _, _ = trainer._tokenize_prompts([[{"role": "user", "content": "1+2="}]] * 2)
    trainer._generate_single_turn(prompt_ids, None, {}, 2)
    assert calls == [(2, trainer.args.temperature)]
