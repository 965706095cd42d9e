"""CCPO (`advantage_estimator="ccpo"`) through the trainer: the two-agent Think–Solve toy pipeline
(`trl_groupx/toy/two_agent_rollout.py`) played by the shipped tiny model via TRL 1.16's `rollout_func`, the
counterfactual (Solver alone) scored by the run's reward function; one real step, full and LoRA."""

from types import SimpleNamespace

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step
from trl_groupx.advantages.ccpo import ccpo_step_advantages, counterfactual_role_rewards
from trl_groupx.advantages.step_credit import StepBatch, step_to_token_advantages, turn_index_from_tool_mask
from trl_groupx.sampling.counterfactual_rewards import check_counterfactual_rollouts
from trl_groupx.toy import _completion_text
from trl_groupx.toy.counter_rollout import make_counter_game_rollout
from trl_groupx.toy.two_agent_rollout import (
    SOLVER,
    THINKER,
    make_two_agent_rollout,
    team_answer,
    two_agent_answer_reward,
)

G = 4


def team_parity_reward(completions, **kwargs) -> list[float]:
    """A ±1 verifier (as the official one): +1 when the team answer's last character has an odd code point, else −1;
    mixes within groups on the tiny model (which rarely gets the arithmetic right), for the team runs and the
    counterfactual runs alike. Being ±1 already, the verifier outcome of the rewards is the rewards themselves."""
    texts = [team_answer(_completion_text(c)) for c in completions]
    return [1.0 if t and ord(t[-1]) % 2 else -1.0 for t in texts]


def trainer_for(tmp_path, peft=False, rollout_func=None, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft,
                         reward_funcs=team_parity_reward, max_completion_length=16,
                         rollout_func=rollout_func or make_two_agent_rollout(), **flags)


class Capture:
    def __init__(self, trainer):
        self.trainer, self.orig = trainer, trainer._generate_and_score_completions
        trainer._generate_and_score_completions = self

    def __call__(self, inputs):
        self.output = self.orig(inputs)
        self.inputs = inputs
        return self.output


def expected_token_advantages(trainer, cap, **kwargs):
    """The variant's function on the step record, rewards and counterfactual rewards TRL carried, laid out on the
    turns: what the trainer must have written."""
    steps = StepBatch.from_lists([x["step_states"] for x in cap.inputs], [x["step_rewards"] for x in cap.inputs],
                                 modules=[x["step_modules"] for x in cap.inputs])
    params = {k: getattr(trainer.args, k) for k in trainer.variants["advantages"].params}
    step_adv = ccpo_step_advantages(trainer._rewards_per_func[:, 0].cpu(), G, steps,
                                    counterfactual_rewards=trainer._counterfactual_rewards, **params)
    turns = turn_index_from_tool_mask(cap.output["tool_mask"], cap.output["completion_mask"])
    return step_to_token_advantages(step_adv, steps, turns)


@pytest.mark.parametrize("peft", [False, True])
def test_ccpo_through_the_trainer(tmp_path, peft):
    # plain team-reward GRPO on the same pipeline: every turn gets R − mean_g R (Flow-GRPO without std)
    _, base_grads, base_inputs = one_step(trainer_for(tmp_path / "base", peft, advantage_estimator="agentflow",
                                                      agentflow_scale=False))
    # CCPO with no credit (λ = 0) is exactly that
    _, same_grads, _ = one_step(trainer_for(tmp_path / "lam0", peft, advantage_estimator="ccpo", ccpo_lambda=0.0))
    assert not grads_differ(base_grads, same_grads, atol=1e-6)

    trainer = trainer_for(tmp_path / "ccpo", peft, advantage_estimator="ccpo")  # official defaults
    cap = Capture(trainer)
    _, grads, inputs = one_step(trainer)
    assert torch.equal(torch.sort(inputs["completion_ids"], dim=0).values,
                       torch.sort(base_inputs["completion_ids"], dim=0).values)  # same batch (rows shuffled)
    # the counterfactual runs were scored by the run's reward function
    tok = trainer.processing_class
    solo_texts = [[{"role": "assistant", "content": tok.decode(x["counterfactual_completion_ids"],
                                                               skip_special_tokens=True)}] for x in cap.inputs]
    assert trainer._counterfactual_rewards.tolist() == team_parity_reward(solo_texts)
    # the batch holds credit events (else the comparison below would prove nothing)
    r1, r2 = counterfactual_role_rewards(trainer._rewards_per_func[:, 0].cpu(), trainer._counterfactual_rewards, G)
    assert not torch.equal(r1, r2)
    assert [x["step_modules"][0] for x in cap.inputs] == [THINKER] * 8
    torch.testing.assert_close(cap.output["advantages"], expected_token_advantages(trainer, cap))
    assert grads_differ(base_grads, grads)


def test_abstract_credit_is_team_minus_counterfactual_on_the_toy_pipeline(tmp_path):
    # catalog check: with the abstract's form the Thinker's reward is R(team) − R(team without the Thinker), both
    # recomputed here from the decoded team answer and the decoded Solver-only answer
    flags = dict(ccpo_credit="marginal", ccpo_solo_baseline="row", ccpo_outcome="raw")
    trainer = trainer_for(tmp_path, advantage_estimator="ccpo", **flags)
    cap = Capture(trainer)
    one_step(trainer)
    tok = trainer.processing_class
    team = torch.tensor(team_parity_reward(tok.batch_decode(cap.output["completion_ids"], skip_special_tokens=True)))
    solo = torch.tensor(team_parity_reward([tok.decode(x["counterfactual_completion_ids"], skip_special_tokens=True)
                                            for x in cap.inputs]))
    local_team = trainer._rewards_per_func[:, 0].cpu()
    assert torch.equal(local_team, team)
    credit, _ = counterfactual_role_rewards(local_team, trainer._counterfactual_rewards, G, **flags)
    assert torch.equal(credit, (team - solo).double()) and (team != solo).any()
    torch.testing.assert_close(cap.output["advantages"], expected_token_advantages(trainer, cap))


def test_episode_where_the_solver_never_acts(tmp_path):
    base = make_two_agent_rollout()

    def thinker_ends_first_episode(prompts, trainer):
        out = base(prompts, trainer)
        eos = trainer.processing_class.eos_token_id
        out["completion_ids"][0] = out["completion_ids"][0][:1] + [eos]  # the Thinker's answer, then EOS
        out["env_mask"][0] = [1, 1]
        for key in ("step_states", "step_rewards", "step_modules"):
            out[key][0] = out[key][0][:1]
        return out

    trainer = trainer_for(tmp_path, rollout_func=thinker_ends_first_episode, advantage_estimator="ccpo")
    cap = Capture(trainer)
    one_step(trainer)
    assert cap.inputs[0]["step_modules"] == [THINKER] and cap.inputs[1]["step_modules"] == [THINKER, SOLVER]
    expected = expected_token_advantages(trainer, cap)
    torch.testing.assert_close(cap.output["advantages"], expected)
    # both tokens of episode 0 carry the Thinker's advantage
    assert cap.output["advantages"][0, 0] == cap.output["advantages"][0, 1]


def test_composes_with_an_objective(tmp_path):
    _, base_grads, _ = one_step(trainer_for(tmp_path / "a", advantage_estimator="ccpo"))
    loss, grads, _ = one_step(trainer_for(tmp_path / "b", advantage_estimator="ccpo", loss_type="gmpo"))
    assert torch.isfinite(loss) and grads_differ(base_grads, grads)
    # the official optimiser: GSPO's sequence ratio with clip 3e-4 / 4e-4, token-mean (the variant's flags)
    flags = trl_groupx.get_variant("ccpo").flags
    loss, grads, _ = one_step(trainer_for(tmp_path / "c", **flags))
    assert torch.isfinite(loss) and any(g.abs().sum() > 0 for g in grads.values())


def test_refusals_name_the_fix(tmp_path):
    with pytest.raises(ValueError, match="advantage_estimator='ccpo'.*pass a rollout_func"):
        build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path / "a", advantage_estimator="ccpo")
    with pytest.raises(ValueError, match="counterfactual_completion_ids"):  # e.g. environments but no rollout_func
        check_counterfactual_rollouts(SimpleNamespace(rollout_func=None), "ccpo")
    # a rollout_func that records no agents
    with pytest.raises(ValueError, match="advantage_estimator='ccpo'.*step_modules"):
        one_step(trainer_for(tmp_path / "b", rollout_func=make_counter_game_rollout(), advantage_estimator="ccpo"))
    base = make_two_agent_rollout()

    def no_counterfactual(prompts, trainer):
        out = base(prompts, trainer)
        del out["counterfactual_completion_ids"]
        return out

    with pytest.raises(ValueError, match="advantage_estimator='ccpo'.*carry no `counterfactual_completion_ids`"):
        one_step(trainer_for(tmp_path / "c", rollout_func=no_counterfactual, advantage_estimator="ccpo"))


def test_two_agent_answer_reward():
    rewards = two_agent_answer_reward([[{"role": "assistant", "content": "1|9"}], "19", "1|8", "|19"],
                                      ["19", "19", "19", "19"])
    assert rewards == [1.0, 1.0, 0.0, 1.0]
