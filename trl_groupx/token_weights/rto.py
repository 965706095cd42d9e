"""RTO (Reinforced Token Optimization): token-wise rewards from a DPO-trained model's implicit reward, added to the
outcome advantage as a reward-to-go.

The DPO model (`rto_dpo_model`, a model id or local path with the policy's tokenizer) is loaded once when the trainer
is built (`load_dpo_model`, dGRPO's loader for a frozen second model), frozen, in eval mode; its log-probs of the
sampled tokens are computed once per generation batch with no grad and reach the variant as
`TokenContext.dpo_logps` (requirement `dpo_logps`). The reference is the policy's initial model: the base model with
the LoRA adapter disabled, or TRL's reference model (`beta > 0`) under full fine-tuning (requirement `ref_logps`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..contracts import TokenContext
from ..registry import register
from ._checks import clean_advantages

OFFICIAL = "zkshan2002/RTO@f2c12948c2d9ce68519d174b891b27e0672bc571"


def _validate(config) -> None:
    for flag, strict in (("rto_dpo_reward_scale", True), ("rto_dpo_reward_clip", False), ("rto_kl_coef", False)):
        value = getattr(config, flag)
        bad = isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
        if bad or value < 0 or (strict and value == 0):
            bound = "> 0" if strict else ">= 0 (0 turns it off)"
            raise ValueError(f"{flag} must be a finite number {bound}, got {value!r}.")
    path = config.rto_dpo_model
    if path is not None and (not isinstance(path, str) or not path.strip()):
        raise ValueError(
            "rto_dpo_model must be a model id or a local path (a DPO-trained model with the policy's tokenizer), "
            f"got {path!r}."
        )


@register(
    "rto",
    name="RTO (Reinforced Token Optimization)",
    paper="DPO Meets PPO: Reinforced Token Optimization for RLHF, arXiv:2404.18922",
    official_code=f"{OFFICIAL}:openrlhf/trainer/ppo_utils/experience_maker.py",
    stage="token_weights",
    flags={"token_weighting": "rto", "rto_dpo_reward_scale": 0.05, "rto_dpo_reward_clip": 0.05, "rto_kl_coef": 0.01,
           "beta": 0.0},
    needs=("a DPO-trained model (rto_dpo_model: trained by DPO from the policy's initial model, with the policy's "
           "tokenizer), one no-grad forward per generation batch",),
    requires=("old_logps", "ref_logps", "dpo_logps"),
    params=("rto_dpo_model", "rto_dpo_reward_scale", "rto_dpo_reward_clip", "rto_kl_coef"),
    validate=_validate,
)
def rto_token_advantages(
    advantages: torch.Tensor, ctx: TokenContext, *, rto_dpo_reward_scale: float, rto_dpo_reward_clip: float,
    rto_kl_coef: float,
) -> torch.Tensor:
    r"""RTO token advantages: the outcome advantage plus the reward-to-go of DPO token rewards and a KL penalty.

    With `m` the completion mask, `π_dpo` the DPO-trained model, `π_ref` the policy's initial model and `π_old` the
    rollout policy (log-probs of the sampled tokens, all at the sampling temperature):

        r^dpo_t = clip(β1 · (log π_dpo(y_t) − log π_ref(y_t)), −c, c) · m_t      (β1 = rto_dpo_reward_scale,
                                                                             c = rto_dpo_reward_clip; c = 0: no clip)
        r^kl_t  = −κ · (log π_old(y_t) − log π_ref(y_t)) · m_t                   (κ = rto_kl_coef)
        A_{i,t} = sg( A_i + Σ_{k ≥ t} (r^dpo_k + r^kl_k) ) · m_t                  (γ = 1)

    `A_i` is the run's group advantage of the outcome reward (GRPO's by default, or any advantage variant's). Without
    the clip, `Σ_t r^dpo_t = β1 · log(π_dpo(y|x) / π_ref(y|x))`, DPO's implicit sequence reward with β = β1: the
    token rewards split it over the tokens (the paper's token-MDP reading of DPO).

    Official code (PPO with a critic), zkshan2002/RTO@f2c12948c2d9ce68519d174b891b27e0672bc571:
    - `openrlhf/trainer/ppo_utils/experience_maker.py` `NaiveExperienceMaker._compute_dpo_rewards` (l.220-232):
      `(dpo_logp − base_logp) · action_mask`, times `dpo_reward_scale` (β1; applied only when > 0 and ≠ 1), then
      `clamp(±dpo_reward_clip)` when the clip is > 0; `base_logp` is the `initial_model`'s (the PPO init, l.161), so
      the DPO model's own reference (`--dpo_ref`), when given, is loaded but never read; both models score raw logits
      (`openrlhf/models/actor.py` `Actor.forward`, no temperature; sampling temperature 1.0 by default).
    - `openrlhf/models/utils.py` `compute_reward` (l.30-74): per-token reward = the outcome reward (clamped to ±10)
      on the last completion token + `−kl_coef · (logp_actor − logp_init)` on every token + the DPO token rewards.
    - `make_experience` (l.145-219) then runs GAE with the critic (`get_advantages_and_returns`, γ = 1, λ = 0.95)
      and `ppo_trainer.py` (l.236) whitens the advantages over the replay buffer.
    - `examples/scripts/train_rto_llama_8b.sh`: `--dpo_reward_scale 0.05 --dpo_reward_clip 0.05 --init_kl_coef 0.01`
      (the CLI defaults, `openrlhf/cli/train_ppo.py` l.302-303, are 1.0 and no clip): our defaults.

    Choice (critic-free reading): with no critic, the return-to-go replaces GAE's λ-return, and the outcome reward's
    part of it is replaced by the group advantage `A_i` (its group-relative baseline standing in for the critic's
    value). With γ = 1 the outcome reward sits in every token's return-to-go, so `A_i` on every token matches it; the
    token rewards enter un-baselined and unnormalised (the official code's GAE baselines them with the critic and
    whitens the sum; GRPO's `A_i` is already on a unit scale, so β1 keeps the same role: token rewards small beside
    the outcome's). This is FRPO's shape (`frpo.py`) with the DPO log-ratio as an added reward. Further choices:
    the reward-side KL is kept (RTO's `compute_reward`; `rto_kl_coef = 0` turns it off), so the flags set `beta = 0`
    (no loss-side KL besides it) — under full fine-tuning TRL loads a reference model only with `beta > 0`, which
    then also adds TRL's loss-side KL (the trainer refuses full fine-tuning with `beta = 0`); the outcome reward is
    not clamped to ±10 (it enters through the advantage stage); both models' logits are divided by the run's
    sampling temperature, as TRL's reference log-probs are (the official code reads raw logits and samples at 1.0:
    the same at `temperature = 1`); unscored rollouts (NaN reward) get 0 on every token.

    Shapes: `advantages` `(N,)`; `ctx.logps`, `ctx.ref_logps`, `ctx.dpo_logps`, `ctx.completion_mask` `(N, T)`;
    returns `(N, T)`, 0 on padding, whose values are never read.
    """
    if ctx.logps is None or ctx.ref_logps is None or ctx.dpo_logps is None:
        raise ValueError(
            "token_weighting='rto' needs rollout, reference and DPO-model log-probs in the TokenContext "
            "(requirements old_logps, ref_logps, dpo_logps)."
        )
    adv = clean_advantages("rto", advantages, ctx.rewards)
    mask = ctx.completion_mask.bool()
    rewards = dpo_token_rewards(ctx.dpo_logps, ctx.ref_logps, mask, rto_dpo_reward_scale, rto_dpo_reward_clip)
    if rto_kl_coef:
        rewards = rewards - rto_kl_coef * masked_log_ratio(ctx.logps, ctx.ref_logps, mask)
    out = torch.where(mask, adv[:, None] + reward_to_go(rewards), torch.zeros_like(rewards))
    if ctx.rewards is not None:
        out = out.masked_fill(torch.isnan(ctx.rewards)[:, None], 0.0)
    return out


def masked_log_ratio(logps: torch.Tensor, ref_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`log π − log π_ref` `(N, T)` float32 on the tokens where `mask` is true, 0 elsewhere (padding is never read,
    so it may hold anything, NaN included)."""
    logps, ref_logps = logps.detach().float(), ref_logps.detach().float()
    return torch.where(mask, logps - torch.where(mask, ref_logps, logps), torch.zeros_like(logps))


def dpo_token_rewards(dpo_logps: torch.Tensor, ref_logps: torch.Tensor, mask: torch.Tensor, scale: float,
                      clip: float) -> torch.Tensor:
    """RTO's token rewards `clip(β1 (log π_dpo − log π_ref), ±c)` `(N, T)`, 0 on padding; `clip = 0`: unclipped
    (then each row sums to β1 times the DPO model's sequence log-ratio, DPO's implicit reward)."""
    rewards = scale * masked_log_ratio(dpo_logps, ref_logps, mask)
    return rewards.clamp(-clip, clip) if clip > 0 else rewards


def reward_to_go(rewards: torch.Tensor) -> torch.Tensor:
    """`Σ_{k ≥ t} r_k` along the last dimension (γ = 1), the current token included."""
    return rewards.flip(-1).cumsum(-1).flip(-1)


def load_dpo_model(trainer: Any) -> torch.nn.Module:
    """The frozen DPO model of an RTO run, loaded from `rto_dpo_model` by dGRPO's loader of a frozen second model
    (`trl_groupx.objective.dgrpo.load_frozen_model`: same tokenizer and a logit width covering the policy's
    vocabulary, checked; the policy's dtype; `requires_grad=False`, eval mode, on the trainer's device). Raises
    `ValueError` naming `rto_dpo_model` and the fix when it is unset or unusable."""
    from ..objective.dgrpo import load_frozen_model

    path = trainer.args.rto_dpo_model
    if path is None:
        raise ValueError(
            "token_weighting='rto' scores every token with a DPO-trained model, but rto_dpo_model is not set: pass "
            "the model id or local path of a model trained by DPO from the policy's initial model, with the "
            "policy's tokenizer."
        )
    return load_frozen_model(trainer, path, flag="rto_dpo_model", role="DPO model")


def dpo_token_logps(trainer: Any, dpo_model: torch.nn.Module, output: dict[str, Any],
                    forward_keys: tuple[str, ...] = ()) -> torch.Tensor:
    """This process's `(B, T)` no-grad log-probs of its sampled tokens under the DPO model (dGRPO's
    `teacher_token_logps`: TRL's log-prob path, logits divided by the run's temperature)."""
    from ..objective.dgrpo import teacher_token_logps

    return teacher_token_logps(trainer, dpo_model, output, forward_keys)
