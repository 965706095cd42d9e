"""RC-GRPO (Reward-Conditioned GRPO): one reward-goal token per rollout, in the configured ratio inside every group.

The generation change runs in the trainer (`reward_tokens.condition_on_reward_tokens`, called from
`GRPOTrainer._generate_and_score_completions` before TRL's generation, its `before` hook in `generation_hooks.py`):
each training row's prompt gets its condition token, so TRL generates, scores and trains every rollout under its
conditioned prompt. This module registers the variant, validates its flags and holds the pure parts (the
per-group apportionment, the seeded assignment, the prompt placement). The reward-conditioned SFT stage that must
come first (RCTP) has its data utility and tokenizer helper in `rctp.py`.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from typing import Any

import torch

from ..contracts import RolloutBatch
from ..registry import get_variant, register
from .prompt_rewrite import append_to_prompt

VARIANT_ID = "rc_grpo"
TOKENS_FLAG = "rc_grpo_prompt_condition_tokens"
MIX_FLAG = "rc_grpo_condition_mix"
HIGH_REWARD_TOKEN = "<|high_reward|>"
LOW_REWARD_TOKEN = "<|low_reward|>"
DEFAULT_CONDITION_TOKENS: tuple[str, ...] = (HIGH_REWARD_TOKEN, LOW_REWARD_TOKEN)
DEFAULT_CONDITION_MIX: tuple[float, ...] = (0.5, 0.5)
#: Extra column each conditioned row carries (its token), passed to reward functions like any dataset column.
CONDITION_COLUMN = "rc_grpo_condition"


def validate(config: Any) -> None:
    """Config-time checks of the tokens and the mix (whether the tokens are single tokens of the tokenizer is
    checked at trainer construction, where the tokenizer is known: `reward_tokens.check_reward_tokens`)."""
    tokens = getattr(config, TOKENS_FLAG)
    if (not isinstance(tokens, (list, tuple)) or len(tokens) < 2
            or not all(isinstance(t, str) and t.strip() for t in tokens) or len(set(tokens)) != len(tokens)):
        raise ValueError(f"{TOKENS_FLAG}={tokens!r} must list at least two distinct non-empty reward-goal tokens "
                         f"(RC-GRPO: {list(DEFAULT_CONDITION_TOKENS)}).")
    mix = getattr(config, MIX_FLAG)
    if (not isinstance(mix, (list, tuple)) or len(mix) != len(tokens)
            or not all(isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) and w >= 0
                       for w in mix)
            or abs(sum(mix) - 1.0) > 1e-6):
        raise ValueError(f"{MIX_FLAG}={mix!r} must give one non-negative share per token of {TOKENS_FLAG} "
                         f"({len(tokens)} here), summing to 1: the fraction of each group's rollouts conditioned on "
                         f"that token (RC-GRPO: {list(DEFAULT_CONDITION_MIX)}).")
    if getattr(config, "use_vllm", False) and getattr(config, "vllm_mode", "colocate") == "server":
        raise ValueError(f"rollout_filter={VARIANT_ID!r} gives each rollout of a group its own condition token, and "
                         "TRL's vllm_mode='server' generates all of a group's completions from the group's first "
                         "prompt (trl/generation/vllm_generation.py, `all_prompts[::num_generations]`). Use "
                         "vllm_mode='colocate' (one completion per row) or use_vllm=False.")
    estimator = getattr(config, "advantage_estimator", "grpo")
    if estimator not in (None, "grpo"):
        keyed = {"prompt_keys", "prompt_kl"} & set(get_variant(estimator).requires)
        if keyed:
            raise ValueError(f"advantage_estimator={estimator!r} keeps per-prompt state keyed by the prompt's tokens "
                             f"({sorted(keyed)}), and rollout_filter={VARIANT_ID!r} gives the rows of one group "
                             "different prompt tokens (their condition tokens). Use another advantage_estimator.")


def group_condition_counts(mix: Sequence[float], group_size: int, offset: float) -> list[int]:
    """How many of a group's `group_size` rollouts get each token: systematic apportionment of `group_size · mix`.

    Token `k` gets the number of points `offset + i` (`i = 0..G-1`) in `[G·C_{k-1}, G·C_k)`, `C_k` the cumulative
    shares, `offset ∈ [0, 1)`. So every count is `floor(G·m_k)` or `ceil(G·m_k)` (the ratio is exact up to one
    rollout) and, with `offset ~ U[0, 1)`, its expectation is exactly `G·m_k` (no token is favoured by rounding)."""
    if not 0.0 <= offset < 1.0:
        raise ValueError(f"offset must lie in [0, 1), got {offset}.")
    counts, below, cumulative = [], 0, 0.0
    for k, share in enumerate(mix):
        cumulative += share
        edge = group_size if k == len(mix) - 1 else round(group_size * cumulative, 9)  # the last edge is exactly G
        upto = min(group_size, max(0, math.ceil(edge - offset)))  # points offset + i below the edge
        counts.append(upto - below)
        below = upto
    return counts


def condition_seed(seed: int, step: int, micro_step: int, group: int) -> int:
    """Seed of one group's assignment: a hash of (run seed, optimizer step, micro-step, global group index), equal
    on every process and across restarts from a checkpoint (Python's `hash` is salted per process, hence sha256)."""
    digest = hashlib.sha256(f"{VARIANT_ID}/{seed}/{step}/{micro_step}/{group}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def group_conditions(mix: Sequence[float], group_size: int, seed: int) -> list[int]:
    """Token index of each of a group's `group_size` rollouts, in row order: `group_condition_counts` with a seeded
    offset, then a seeded shuffle (so no row position of a group is tied to one token)."""
    rng = random.Random(seed)
    counts = group_condition_counts(mix, group_size, rng.random())
    order = [k for k, c in enumerate(counts) for _ in range(c)]
    rng.shuffle(order)
    return order


def row_conditions(mix: Sequence[float], group_size: int, first_row: int, num_rows: int, *, seed: int, step: int,
                   micro_step: int = 0) -> list[int]:
    """Token index of `num_rows` consecutive rows starting at global row `first_row` of a generation batch (row `r`
    is rollout `r mod G` of group `r // G`). A process holding part of a group draws the whole group's assignment
    and keeps its rows, so a group split across processes still has the configured counts."""
    rows, cache = [], {}
    for r in range(first_row, first_row + num_rows):
        group = r // group_size
        if group not in cache:
            cache[group] = group_conditions(mix, group_size, condition_seed(seed, step, micro_step, group))
        rows.append(cache[group][r % group_size])
    return rows


def condition_prompt(prompt: Any, token: str) -> Any:
    """`prompt` carrying `token`: appended to a text prompt; for a conversational prompt, a copy whose last user
    message ends with it (a content-block list gets a text block). The same placement is used for the RCTP SFT rows
    (`rctp.reward_conditioned_sft_rows`), so RL conditions the policy exactly as it was fine-tuned."""
    return append_to_prompt(prompt, token, selector=f"rollout_filter={VARIANT_ID!r}", what="reward token")


@register(
    VARIANT_ID,
    name="RC-GRPO (Reward-Conditioned GRPO): reward-goal tokens sampled per rollout in each group",
    paper="RC-GRPO: Reward-Conditioned Group Relative Policy Optimization for Multi-Turn Tool Calling Agents, "
          "arXiv:2602.03025",
    official_code=None,
    stage="sampling",
    flags={"rollout_filter": VARIANT_ID, TOKENS_FLAG: list(DEFAULT_CONDITION_TOKENS),
           MIX_FLAG: list(DEFAULT_CONDITION_MIX), "num_generations": 4},
    needs=("a reward-conditioned (RCTP) checkpoint fine-tuned with the condition tokens in its prompts (stage 1: "
           "trl_groupx.sampling.rctp adds the tokens and builds the SFT rows)",),
    params=(TOKENS_FLAG, MIX_FLAG),
    validate=validate,
)
def rc_grpo(batch: RolloutBatch) -> torch.Tensor:
    r"""RC-GRPO's reward-conditioned sampling (arXiv:2602.03025, abstract; the catalog's
    `prompt_condition_tokens=[...]`, `condition_mix=...`, here `rollout_filter="rc_grpo"`,
    `rc_grpo_prompt_condition_tokens=[...]`, `rc_grpo_condition_mix=[...]`).

    Two stages (the paper's):

    1. RCTP, supervised: fine-tune the policy on mixed-quality trajectories whose prompts carry a reward-goal
       special token matching the trajectory's quality (`<|high_reward|>`, `<|low_reward|>`; the labelling rule is
       a choice below), so that the model learns to produce either quality on demand. trl_groupx ships the data side
       (`trl_groupx.sampling.rctp`: `add_condition_tokens(tokenizer, model)` adds the tokens and resizes the
       embeddings; `reward_conditioned_sft_rows(trajectories, threshold=...)` writes the SFT rows); the SFT run
       itself is TRL's `SFTTrainer`. The RL stage refuses a tokenizer without the tokens.
    2. RL (this variant): for every prompt `x` of a training batch, the `G = num_generations` rollouts are
       conditioned on tokens `c_1..c_G` drawn from the `K` configured tokens with shares `m_1..m_K`
       (`rc_grpo_condition_mix`), `y_i ~ π_θ(· | x ⊕ c_i)`; the rewards `r_i = Σ_f w_f r_f(x ⊕ c_i, y_i)`, the
       advantages (TRL's GRPO `(r_i − mean_g r) / (std_g r + ε)`, or whichever advantage, token and objective
       stages are set) and the log-probs `log π_θ(y_i | x ⊕ c_i)` all use the conditioned prompt. Mixing goal
       tokens inside a group spreads its outcomes, so fewer groups are all-0 or all-1 and the group-normalised
       advantage stays informative (the abstract: SFT then GRPO "can stall when within-group reward variation is
       low", all-0 or all-1 groups giving vanishing updates).

    The token is part of the prompt: its ids sit in `prompt_ids`, never in `completion_ids`, so the completion mask
    (and every loss, KL and normaliser) excludes them by construction; a condition token the policy samples in
    its completion is masked out of the loss too (choice below).

    Shapes: `(N = P·G)` rows as TRL lays them out; per group a length-`G` list of token indices; the batch the later
    stages see is TRL's usual one.

    Source: the paper's abstract (two stages; reward-goal tokens injected into the prompts; "we sample diverse
    reward tokens within each GRPO group and condition rollouts on the sampled token"). No official code is known;
    a secondary source gives a per-rollout token with p ≈ 0.5 and G = 4 (our defaults). The choices are ours:

    - Choice: placement. The token is appended, with no separator, to the prompt string, or to the content of the
      last user message of a conversational prompt (so a chat template puts it right before the assistant turn,
      and the multi-turn tool schema and system message stay as they are). RCTP's SFT rows use the same function
      (`condition_prompt`), so the policy sees the token where it learned it.
    - Choice: exact ratio, not an independent draw per rollout. Each group's counts are a systematic
      apportionment of `G·m_k` (`group_condition_counts`): `floor` or `ceil` of `G·m_k`, so G = 4 with
      `[0.5, 0.5]` always gives 2 + 2, and G = 5 gives 3 + 2 or 2 + 3 with probability 1/2 each (expected share
      exactly `m_k`). Independent Bernoulli(0.5) draws would leave a G = 4 group all-high or all-low 1/8 of the
      time, which is the degenerate group the method exists to avoid. The tokens are then shuffled inside the
      group, so no row position is tied to one token (`generation_temperatures` pairs with positions).
    - Choice: seeding. A group's assignment depends only on (`seed`, optimizer step, micro-step inside the
      accumulation window, global group index) through a sha256 hash (`condition_seed`), never on a process's RNG
      state: runs are reproducible, a restart from a checkpoint draws the same tokens, and every process computes
      the same assignment for a group, so a group split across processes still has the configured counts, without
      any communication.
    - Choice: RCTP labels (`rctp.reward_conditioned_sft_rows`): a trajectory gets `<|high_reward|>` when its
      reward is at least a user-given `threshold` (1.0 for a 0/1 success reward such as BFCL's multi-turn
      accuracy), `<|low_reward|>` otherwise; unscored trajectories are an error, not dropped.
    - Choice: evaluation (model not training) generates from the plain prompts, without any token, as the paper
      evaluates the trained policy on BFCL's own prompts. A policy that learned to depend on the token should be
      evaluated with `<|high_reward|>` by the user's own evaluation harness (`condition_prompt`), not here.
    - Choice: reward functions receive the conditioned prompt as `prompts` (what was generated from) and the token
      in the extra column `rc_grpo_condition`; the completions table logs the conditioned prompt. The share of
      rows per token is logged as `groupx/rc_grpo_share_<k>` (k = the token's index).
    - Choice: a condition token that a completion samples itself (RCTP never puts them in completions, but a
      policy may still give them mass, e.g. right after the embeddings were resized) gets no loss: it is set to 0
      in TRL's `tool_mask` (created when the batch has none), so it stays attended, as tool output does, and the
      later tokens keep the log-probs they were sampled with; `num_items_in_batch` is recounted over
      `completion_mask · tool_mask`, and the share of such tokens is logged as
      `groupx/rc_grpo_sampled_condition_token_fraction`. Generation does not suppress them (that would need
      per-backend logits processors, and the rollout_func path could not be covered).

    Scope: any generation path, since only the rows' prompts change before TRL's own generation: transformers,
    vLLM (its tokenizer must be the RCTP checkpoint's; not exercised by the CPU tests), a `rollout_func`, tools or
    environments (multi-turn tool calling, the paper's setting: the token sits in the first prompt; later turns are
    the environment's). Advantage variants with per-prompt state keyed by the prompt's tokens (`prompt_keys`,
    `prompt_kl`) are refused at config time: a group's rows no longer share one prompt. Text prompts and
    conversational prompts with a user message.

    This function is the stage's filter on the conditioned batch: it keeps every rollout, so the variant composes
    with every advantage estimator (except the per-prompt-state ones), token weighting and objective, but not with
    another `rollout_filter`.

    Args:
        batch (`RolloutBatch`): the global batch of conditioned rollouts.

    Returns:
        `torch.Tensor`: `(N,)` bool keep mask, all True.
    """
    if torch.isinf(batch.rewards).any():
        raise ValueError(
            f"rollout_filter={VARIANT_ID!r} got ±inf rewards; reward functions must return finite values or NaN."
        )
    return torch.ones(batch.rewards.shape[0], dtype=torch.bool, device=batch.rewards.device)
