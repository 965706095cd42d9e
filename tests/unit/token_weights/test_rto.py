"""RTO token advantages on hand-derived tensors: DPO token rewards and their clip, the sum-to-sequence check, the
reward-side KL, reward-to-go, the official return (critic-free), padding, unscored rollouts, config errors."""

import pytest
import torch

from trl_groupx import GRPOConfig
from trl_groupx.advantages import group_normalized_advantages
from trl_groupx.contracts import TokenContext
from trl_groupx.token_weights.rto import dpo_token_rewards, reward_to_go, rto_token_advantages

NAN = float("nan")
BASE = dict(output_dir="/tmp/unused", use_cpu=True, bf16=False)


def run(adv, dpo, ref, mask, old=None, rewards=None, scale=1.0, clip=0.0, kl=0.0, group_size=1):
    ref = torch.tensor(ref)
    ctx = TokenContext(torch.tensor(mask), group_size, logps=ref.clone() if old is None else torch.tensor(old),
                       ref_logps=ref, dpo_logps=torch.tensor(dpo),
                       rewards=None if rewards is None else torch.tensor(rewards))
    return rto_token_advantages(torch.tensor(adv), ctx, rto_dpo_reward_scale=scale, rto_dpo_reward_clip=clip,
                                rto_kl_coef=kl)


def test_token_rewards_their_clip_and_reward_to_go():
    # log π_dpo − log π_ref = [0.5, −1.0, 0.0]; β1 = 0.2 → [0.1, −0.2, 0.0]; clip 0.15 → [0.1, −0.15, 0.0]
    # reward-to-go [0.1 − 0.15, −0.15, 0.0] = [−0.05, −0.15, 0.0]; A = 1 → [0.95, 0.85, 1.0]
    out = run([1.0], [[-1.0, -2.0, -0.5]], [[-1.5, -1.0, -0.5]], [[1.0, 1.0, 1.0]], scale=0.2, clip=0.15)
    torch.testing.assert_close(out, torch.tensor([[0.95, 0.85, 1.0]]))
    # without the clip: rewards [0.1, −0.2, 0.0], reward-to-go [−0.1, −0.2, 0.0]
    out = run([1.0], [[-1.0, -2.0, -0.5]], [[-1.5, -1.0, -0.5]], [[1.0, 1.0, 1.0]], scale=0.2, clip=0.0)
    torch.testing.assert_close(out, torch.tensor([[0.9, 0.8, 1.0]]))
    torch.testing.assert_close(reward_to_go(torch.tensor([[1.0, 2.0, 3.0]])), torch.tensor([[6.0, 5.0, 3.0]]))


def test_unclipped_token_rewards_sum_to_the_dpo_implicit_reward():
    # Σ_t β1 (log π_dpo(y_t) − log π_ref(y_t)) = β1 log(π_dpo(y|x) / π_ref(y|x)), the sequence log-probs being the
    # sums of the token log-probs over the real tokens only (row 1 has two padding positions)
    torch.manual_seed(0)
    dpo, ref = -torch.rand(3, 5) * 3, -torch.rand(3, 5) * 3
    mask = torch.ones(3, 5)
    mask[1, 3:] = 0
    beta1 = 0.1
    rewards = dpo_token_rewards(dpo, ref, mask.bool(), beta1, 0.0)
    implicit = beta1 * ((dpo * mask).sum(-1) - (ref * mask).sum(-1))
    torch.testing.assert_close(rewards.sum(-1), implicit)
    # the first token's reward-to-go is the whole implicit reward: A_{i,0} − A_i
    ctx = TokenContext(mask, 3, logps=ref.clone(), ref_logps=ref, dpo_logps=dpo)
    out = rto_token_advantages(torch.tensor([0.5, -0.5, 0.0]), ctx, rto_dpo_reward_scale=beta1,
                               rto_dpo_reward_clip=0.0, rto_kl_coef=0.0)
    torch.testing.assert_close(out[:, 0] - torch.tensor([0.5, -0.5, 0.0]), implicit)


def test_reward_side_kl_penalty():
    # DPO model = reference: no DPO reward. log π_old − log π_ref = [0.2, −0.2], κ = 0.5 → r^kl = [−0.1, 0.1],
    # reward-to-go [0.0, 0.1]
    out = run([0.0], [[-1.2, -0.8]], [[-1.2, -0.8]], [[1.0, 1.0]], old=[[-1.0, -1.0]], kl=0.5)
    torch.testing.assert_close(out, torch.tensor([[0.0, 0.1]]))
    # κ = 0: the KL term is off
    out = run([0.0], [[-1.2, -0.8]], [[-1.2, -0.8]], [[1.0, 1.0]], old=[[-1.0, -1.0]], kl=0.0)
    assert (out == 0).all()


def test_official_return_without_critic():
    # Built by reading zkshan2002/RTO@f2c1294: _compute_dpo_rewards ((dpo − init) · mask, × β1, clamp ±c) and
    # compute_reward (outcome r on the last real token − κ (old − init) + the DPO rewards); its return with γ = 1
    # and no critic (GAE with V = 0, λ = 1) equals ours with A_i := r_i.
    # Row 0 (4 tokens): dpo − ref = [1.0, 0.0, −2.0, 0.1] → ×0.05 → [0.05, 0, −0.1, 0.005] → clip 0.05 →
    #   [0.05, 0, −0.05, 0.005]; old − ref = [0.5, −0.1, 0.0, 0.2] → −0.01× → [−0.005, 0.001, 0, −0.002];
    #   rewards [0.045, 0.001, −0.05, 0.003 + r=1.0] → return [0.999, 0.954, 0.953, 1.003]
    # Row 1 (3 tokens, padding at t=3 holding junk): dpo − ref = [0, 0.5, −0.1] → [0, 0.025, −0.005]; old = ref;
    #   rewards [0, 0.025, −0.005 + r=−1.0] → return [−0.98, −0.98, −1.005]
    out = run(
        [1.0, -1.0],
        dpo=[[-1.0, -0.2, -3.0, -0.5], [-0.5, -0.5, -0.5, 9.0]],
        ref=[[-2.0, -0.2, -1.0, -0.6], [-0.5, -1.0, -0.4, -9.0]],
        old=[[-1.5, -0.3, -1.0, -0.4], [-0.5, -1.0, -0.4, 7.0]],
        mask=[[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]],
        scale=0.05, clip=0.05, kl=0.01,
    )
    torch.testing.assert_close(out, torch.tensor([[0.999, 0.954, 0.953, 1.003], [-0.98, -0.98, -1.005, 0.0]]))


def test_padding_is_never_read():
    # NaN and huge values at the padding positions of every input: real tokens unaffected, padding gets 0
    out = run([0.0], [[-1.0, NAN, 1e30]], [[-2.0, 50.0, NAN]], [[1.0, 0.0, 0.0]], old=[[-2.0, NAN, -1e30]],
              scale=1.0, clip=0.0, kl=1.0)
    torch.testing.assert_close(out, torch.tensor([[1.0, 0.0, 0.0]]))


def test_unscored_rollouts_and_empty_completions_get_zero():
    out = run([NAN, 1.0, 0.5], [[0.0, 0.0]] * 3, [[-1.0, -1.0]] * 3, [[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]],
              rewards=[NAN, 1.0, 1.0])
    assert (out[:2] == 0).all()
    torch.testing.assert_close(out[2], torch.tensor([2.5, 1.5]))  # 0.5 + reward-to-go of [1, 1]


@pytest.mark.parametrize("group_size", [2, 4])
def test_group_sizes_and_all_equal_groups(group_size):
    # rows are independent: the token part is each row's own reward-to-go whatever G; an all-equal group has
    # A_i = 0, so its tokens keep only the DPO reward-to-go (the token rewards train even where the outcome is flat)
    n = 8
    rewards = torch.tensor([1.0, 0.0] * (n // 2))
    rewards[-group_size:] = 1.0  # the last group is all-equal
    adv = group_normalized_advantages(rewards, group_size, scale_rewards="group")
    dpo = torch.full((n, 3), -1.0)
    dpo[:, 0] = -0.5  # log-ratio [0.5, 0, 0] on every row → reward-to-go [0.5, 0, 0] with β1 = 1
    ref = torch.full((n, 3), -1.0)
    ctx = TokenContext(torch.ones(n, 3), group_size, logps=ref.clone(), ref_logps=ref, dpo_logps=dpo, rewards=rewards)
    out = rto_token_advantages(adv, ctx, rto_dpo_reward_scale=1.0, rto_dpo_reward_clip=0.0, rto_kl_coef=0.01)
    torch.testing.assert_close(out, adv[:, None] + torch.tensor([0.5, 0.0, 0.0]))
    assert (adv[-group_size:] == 0).all() and (out[-group_size:, 0] == 0.5).all()


def test_inf_rewards_and_missing_inputs_are_clear_errors():
    with pytest.raises(ValueError, match="token_weighting='rto'.*±inf"):
        run([1.0], [[0.0]], [[0.0]], [[1.0]], rewards=[float("inf")])
    ctx = TokenContext(torch.ones(1, 1), 1, logps=torch.zeros(1, 1), ref_logps=torch.zeros(1, 1))
    with pytest.raises(ValueError, match="DPO-model log-probs.*dpo_logps"):
        rto_token_advantages(torch.zeros(1), ctx, rto_dpo_reward_scale=0.05, rto_dpo_reward_clip=0.05, rto_kl_coef=0.0)


@pytest.mark.parametrize(
    "flags, message",
    [
        (dict(rto_dpo_reward_scale=0.0), r"rto_dpo_reward_scale must be a finite number > 0, got 0.0"),
        (dict(rto_dpo_reward_scale=NAN), r"rto_dpo_reward_scale must be a finite number > 0"),
        (dict(rto_dpo_reward_clip=-0.05), r"rto_dpo_reward_clip must be a finite number >= 0 \(0 turns it off\)"),
        (dict(rto_kl_coef=-1.0), r"rto_kl_coef must be a finite number >= 0"),
        (dict(rto_dpo_model=" "), r"rto_dpo_model must be a model id or a local path"),
    ],
)
def test_bad_flags_fail_at_config_construction(flags, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(**BASE, token_weighting="rto", **flags)


def test_flags_belong_to_rto():
    with pytest.raises(ValueError, match="rto_dpo_model.*belongs to variant 'rto'"):
        GRPOConfig(**BASE, rto_dpo_model="some/dpo-model")
    config = GRPOConfig(**BASE, token_weighting="rto", rto_dpo_model="some/dpo-model")
    assert config.active_variants() == {"token_weights": "rto"}
    assert (config.rto_dpo_reward_scale, config.rto_dpo_reward_clip, config.rto_kl_coef) == (0.05, 0.05, 0.01)
