"""NAT: unbiased partial-token policy gradient (Horvitz–Thompson weights) with URS or RPC token selection."""

from __future__ import annotations

import torch

from ..contracts import TokenContext
from ..registry import register
from ._checks import check_groups, clean_advantages, reject_sequence_averaging_objective

NAT_SCHEMES = ("urs", "rpc")


def _validate(config) -> None:
    if config.nat_scheme not in NAT_SCHEMES:
        raise ValueError(f"nat_scheme must be one of {NAT_SCHEMES}, got {config.nat_scheme!r}.")
    if not 0.0 < config.nat_keep_prob <= 1.0:
        raise ValueError(f"nat_keep_prob must lie in (0, 1] (1 = every token, plain GRPO), got {config.nat_keep_prob!r}.")
    if not 0.0 <= config.nat_rpc_min_fraction <= 1.0:
        raise ValueError(
            f"nat_rpc_min_fraction must lie in [0, 1] (1 = every token, plain GRPO), got {config.nat_rpc_min_fraction!r}."
        )
    reject_sequence_averaging_objective("nat", config)


def nat_generator(seed: int, global_step: int) -> torch.Generator:
    """CPU generator seeded from the run seed and the optimizer step only: every process draws the same masks, and a
    run resumed at step `s` draws the masks the uninterrupted run drew at step `s`."""
    return torch.Generator(device="cpu").manual_seed((int(seed) * 1_000_003 + int(global_step)) % (2**63))


def inclusion_probabilities(mask: torch.Tensor, scheme: str, keep_prob: float, rpc_min_fraction: float) -> torch.Tensor:
    """`(N, T)` float64 inclusion probability π_it of each real token (1 on padding, never used there).

    URS: π = q. RPC: the kept prefix length K_i is uniform on the integers {K_min_i, …, L_i},
    K_min_i = max(1, ⌈c·L_i⌉), so the token at 0-based real position s is kept iff K_i > s:
    π_is = 1 for s < K_min_i, else (L_i − s) / (L_i − K_min_i + 1).
    """
    mask = mask.bool()
    if scheme == "urs":
        return torch.where(mask, torch.full(mask.shape, keep_prob, dtype=torch.float64, device=mask.device),
                           torch.ones(mask.shape, dtype=torch.float64, device=mask.device))
    lengths, k_min, pos = _rpc_layout(mask, rpc_min_fraction)
    span = (lengths - k_min + 1).clamp(min=1).double()
    pi = torch.where(pos < k_min[:, None], torch.ones_like(span[:, None].expand(mask.shape)),
                     (lengths[:, None] - pos).double() / span[:, None])
    return torch.where(mask, pi, torch.ones_like(pi))


def _rpc_layout(mask: torch.Tensor, rpc_min_fraction: float):
    lengths = mask.sum(-1)
    k_min = torch.clamp(torch.ceil(lengths.double() * rpc_min_fraction - 1e-9).long(), min=1)
    k_min = torch.minimum(k_min, lengths.clamp(min=1))
    pos = mask.long().cumsum(-1) - 1  # 0-based index among the real tokens (robust to holes in the mask)
    return lengths, k_min, pos


def sample_keep(mask: torch.Tensor, scheme: str, keep_prob: float, rpc_min_fraction: float,
                generator: torch.Generator) -> torch.Tensor:
    """`(N, T)` bool: the real tokens selected this step. Uniforms are drawn on the CPU generator (so the draw does
    not depend on the device) with one number per position (URS) or per completion (RPC)."""
    mask = mask.bool()
    if scheme == "urs":
        u = torch.rand(mask.shape, generator=generator, dtype=torch.float64).to(mask.device)
        return mask & (u < keep_prob)
    lengths, k_min, pos = _rpc_layout(mask, rpc_min_fraction)
    u = torch.rand(mask.shape[0], generator=generator, dtype=torch.float64).to(mask.device)
    span = (lengths - k_min + 1).clamp(min=1)
    k = torch.minimum(k_min + torch.floor(u * span.double()).long(), lengths)  # uniform on {K_min, …, L}
    return mask & (pos < k[:, None])


@register(
    "nat",
    name="NAT (Not All Tokens Are Needed): Horvitz–Thompson partial-token policy gradient",
    paper="Not all tokens are needed (NAT): token efficient reinforcement learning, arXiv:2603.06619",
    official_code=None,
    stage="token_weights",
    flags={"token_weighting": "nat", "nat_scheme": "urs", "nat_keep_prob": 0.5, "nat_rpc_min_fraction": 0.0},
    requires=("global_step",),
    params=("nat_scheme", "nat_keep_prob", "nat_rpc_min_fraction"),
    validate=_validate,
)
def nat_token_advantages(
    advantages: torch.Tensor,
    ctx: TokenContext,
    *,
    nat_scheme: str,
    nat_keep_prob: float,
    nat_rpc_min_fraction: float,
    seed: int = 0,
    global_step: int = 0,
    total_steps: int = 0,
) -> torch.Tensor:
    r"""Keep a random subset of each completion's tokens and weight the kept ones by 1 / inclusion probability.

        Z_it ~ scheme (independent of the policy's parameters),  π_it = P(Z_it = 1)
        A'_it = A_i · m_it · Z_it / π_it        (0 on padding and on dropped tokens)

    Since E[Z_it / π_it] = 1, E[A'_it] = A_i m_it for every token, and any loss that is linear in a positive
    per-token rescaling of the advantage with a normaliser fixed by the completion mask (TRL's clipped surrogates,
    CISPO, and every `loss_aggregation` of this package) has E_Z[∇ loss(A')] = ∇ loss(A): the Horvitz–Thompson
    estimator of the full-token gradient is unbiased (tested by averaging over seeds in
    `tests/unit/token_weights/test_nat.py`).

    Schemes (`nat_scheme`):
    - `"urs"` (Uniform Random Sampling): each real token is kept independently with probability `q =
      nat_keep_prob`, so `π = q` and kept tokens get `A / q`.
    - `"rpc"` (Random Prefix Cutting): each completion keeps a random prefix of `K_i` real tokens, `K_i` uniform
      on `{K_min_i, …, L_i}` with `K_min_i = max(1, ⌈c·L_i⌉)`, `c = nat_rpc_min_fraction`; the token at 0-based
      position `s` is kept iff `K_i > s`, so `π_is = 1` for `s < K_min_i` and `(L_i − s) / (L_i − K_min_i + 1)`
      after (the catalog's "P(cut ≥ t)"). With `c = 0` about half the tokens are kept on average.
    `q = 1` or `c = 1` keeps every token and returns GRPO's broadcast advantages exactly.

    Randomness: a CPU `torch.Generator` seeded from the config's `seed` and the trainer's `global_step`
    (`seed · 1000003 + global_step`), never the global RNG: every process (they all see the same global batch)
    draws the same masks, and a resumed run draws the same masks as the uninterrupted run at the same step.

    Shapes: `advantages` `(N,)`, `ctx.completion_mask` `(N, T)`; returns `(N, T)`.

    Citation: Sang et al., arXiv:2603.06619 (only the abstract and the catalog row were available; no public code).
    Choices where the abstract is silent, ours and documented:
    - the RPC cut distribution (uniform over kept lengths from `⌈c·L⌉` to `L`, per completion) and its
      parametrisation by `c`; URS keeps tokens independently (Bernoulli), not a fixed-size sample;
    - the NaN-reward rule of the package (unscored rollouts get 0); padding never enters any probability (the
      real-token positions and lengths are counted on the mask only);
    - the loss normaliser keeps counting dropped tokens (it must, for unbiasedness), and with `beta != 0` the KL
      term is computed on every token (not subsampled).
    Limitation: this stage reproduces the estimator (its statistics and gradient noise) but not the compute and
    memory savings: the trainer still runs the policy forward/backward over every completion token. Realising
    them needs a core change (truncating each micro-batch's completions at the last kept position, RPC, or
    gathering kept positions' logits, URS) in the trainer's loss forward. Objectives that average the token
    advantages over a completion (GMPO) would undo the selection and are rejected.
    """
    check_groups(advantages.shape[0], ctx.group_size)
    adv = clean_advantages("nat", advantages, ctx.rewards)
    mask = ctx.completion_mask.bool()
    keep = sample_keep(mask, nat_scheme, nat_keep_prob, nat_rpc_min_fraction, nat_generator(seed, global_step))
    weights = keep.double() / inclusion_probabilities(mask, nat_scheme, nat_keep_prob, nat_rpc_min_fraction)
    return (adv[:, None].double() * weights).to(adv.dtype)
