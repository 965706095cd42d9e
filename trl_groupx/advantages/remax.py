"""ReMax: REINFORCE with the reward of the prompt's greedy completion as the baseline (arXiv:2310.10505).

Dispatched with `advantage_estimator="remax"` (requires `greedy_baseline_rewards`: the trainer decodes one greedy
completion per prompt with the current policy and scores it with the run's reward functions, see
`trl_groupx/sampling/baseline_rollouts.py`).
"""

from __future__ import annotations

import torch

from ..registry import register
from ..sampling.baseline_rollouts import reject_vllm
from ._checks import reject_infinite


@register(
    "remax",
    name="ReMax (greedy-rollout baseline)",
    paper="ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for Aligning Large Language "
    "Models, arXiv:2310.10505",
    official_code="verl-project/verl@1dda039b9c6311889a9c9a26040677e1254814f9:verl/trainer/ppo/core_algos.py",
    stage="advantages",
    flags={"advantage_estimator": "remax"},
    requires=("greedy_baseline_rewards",),
    validate=lambda config: reject_vllm(config, "remax"),
    needs=("one extra greedy generation per prompt and step, scored by the run's reward functions "
           "(transformers generation; not with vLLM, rollout_func, tools or environments)",),
)
def remax_advantages(rewards: torch.Tensor, group_size: int, *, greedy_baseline_rewards: torch.Tensor) -> torch.Tensor:
    """ReMax advantage `A_i = r_i − r(x, ȳ)`, with `ȳ = argmax`-decoded (greedy) completion of rollout `i`'s prompt.

    With outcome rewards the per-token return is the sequence reward at every token, so the token advantage is the
    sequence advantage broadcast (verl `compute_remax_outcome_advantage`, core_algos.py l.735-767: returns =
    reverse cumsum of the token rewards, advantage = returns − baseline). No normalisation: ReMax is REINFORCE with
    a variance-reducing baseline, so the scale of the reward is the scale of the update.

    Official code: verl-project/verl@1dda039b9c6311889a9c9a26040677e1254814f9, `verl/trainer/ppo/core_algos.py`
    `compute_remax_outcome_advantage` l.735-767, and `verl/trainer/ppo/ray_trainer.py` `fit` l.1493-1535 (one
    greedy `do_sample=False` baseline per prompt, scored by the same reward, repeated to the prompt's `n` samples).

    Choices: the paper samples one response per prompt; with `G > 1` every rollout of the group is compared with
    the same greedy baseline (verl's behaviour). A rollout with a NaN (unscored) reward gets 0. When the greedy
    completion itself is unscorable (NaN baseline), the group has no baseline and its rollouts get 0 — we do not
    fall back to the group mean, which would silently turn the estimator into RLOO/GRPO.

    Args:
        rewards (`torch.Tensor`): `(N,)` rewards, groups of `group_size` contiguous, NaN where unscored.
        group_size (`int`): `G` (unused by the formula; the baseline is already per prompt).
        greedy_baseline_rewards (`torch.Tensor`): `(N,)` the reward of the greedy completion of each rollout's
            prompt (equal within a group), NaN where unscorable.

    Returns:
        `torch.Tensor`: `(N,)` advantages.
    """
    reject_infinite(rewards, "remax")
    reject_infinite(greedy_baseline_rewards, "remax")
    if greedy_baseline_rewards.shape != rewards.shape:
        raise ValueError(f"remax: greedy_baseline_rewards has shape {tuple(greedy_baseline_rewards.shape)}, "
                         f"expected {tuple(rewards.shape)} (one baseline per rollout).")
    advantages = rewards - greedy_baseline_rewards.to(rewards)
    return torch.nan_to_num(advantages, nan=0.0)
