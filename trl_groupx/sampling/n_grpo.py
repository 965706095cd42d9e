r"""N-GRPO's Semantic Neighbor Mixing (`rollout_filter="n_grpo"`): at some generation steps the next input is not the
embedding of the generated token but a mix of the embeddings of an anchor token and its nearest semantic neighbours,
and the training forwards replay exactly those inputs.

"N-GRPO: Embedding-Level Neighbor Mixing for Enhanced Policy Optimization", arXiv:2606.10768.
Official code: ZJUSCL/N-GRPO@d9c94fe963a2448123bad68e4a9c208501c8a3d0 (verl + a patched sglang), read at

- `src/sglang-0.4.6.post5/python/sglang/srt/layers/sampler.py`, `Sampler.forward` l.243-284: the weights'
  distribution `p = softmax(top-p(top-k(z / T)))` of each row's logits `z` (the rollout's temperature and filters);
  l.350-414 (`mix_strategy == "neighbor"`, `neighbor_metric="cosine"`): anchor `a = argmax p` (not the sampled
  token), `s_v = cos(E_v, E_a)` over the rows of the input embedding matrix `E`, `s_a = -inf` (the anchor is no
  neighbour of itself), neighbours `n_1..n_{K-1}` = top-(K-1) of `s`, candidates `c = (a, n_1, .., n_{K-1})` with
  probabilities `p_c` (`K = mix_top_k`, anchor included).
- `src/sglang-0.4.6.post5/python/sglang/srt/managers/scheduler_output_processor_mixin.py` l.130-139 and l.187-266:
  per request and step, mixing is drawn with probability `mix_rate` (never at validation); the answer marker
  (`</think>`) is matched on the generated tokens *including* the one just sampled, and from then on no step mixes;
  an unmixed step feeds the sampled token itself (candidates `(y_t)`, weight 1).
- `src/sglang-0.4.6.post5/python/sglang/srt/layers/vocab_parallel_embedding.py` l.500-514 (`weighted_forward`): the
  next input is `x_t = Σ_j w_j E_{c_j}`, `w = p_c / Σ p_c`.
- `src/verl/verl/workers/actor/dp_actor.py` l.197-209 (`_forward_micro_batch`): old, reference and training forwards
  rebuild every position's input from the stored `(c, p_c)` the same way (normalised, summed in the embedding's
  dtype), through the embedding layer, so the gradient reaches the candidates' embedding rows.
- `configs/n-grpo_1_5b.yaml`: `mix_strategy: neighbor`, `neighbor_metric: cosine`, `mix_top_k: 2`, `mix_rate: 0.1`,
  `answer_start: "</think>"`, `disable_mix_on_eval: true`; rollout `n: 4`, temperature 1, lr 5e-7, KL 0.01.

Shapes: at each step `B` rows; candidates `(B, K)`; stored per completion token `(N, T, K)` ids and weights (weights
all zero where the step did not mix).

Here (transformers `generate`, TRL's `_generate_single_turn`; `trl_groupx/sampling/neighbor_mixing.py`): a logits
processor computes the candidates and weights from each step's logits and draws the mixing rows; a forward hook on
the input embedding layer puts `x_t` in place of the embedding of `y_t` for the next forward. The ids and weights of
every completion token ride with the rollout (`n_grpo_mix_ids`, `n_grpo_mix_weights`), and every log-prob forward of
the batch (old, reference, loss, token-stage entropies) replaces the same positions' embeddings by the same mix.

Choices:
- `n_grpo_top_k` is the official `mix_top_k`: candidates including the anchor (2 = anchor + its nearest neighbour).
- The mixing draw uses its own random generator, seeded from `seed`, the optimizer step, the process and the
  generate call, so sampling consumes the same random numbers with or without mixing: `n_grpo_mix_rate=0` gives
  bit-identical rollouts (and TRL's gradient); the official draws from the device's global generator.
- top-p keeps the tokens whose preceding cumulative mass is at most `top_p` (sglang's own sampling rule,
  `top_k_top_p_min_p_sampling_from_probs_torch`), so the anchor always keeps its mass; min-p is not applied to the
  weights, as in the official `latent_probs`.
- Neighbours are searched among the rows the logits cover (`E[:V]`), so every candidate has a probability.
- After a row's first EOS nothing is stored (those positions carry no loss); the last completion token's input is
  never fed during generation and is stored unmixed.
- Only cosine neighbours (the paper's default; the official dot/l1/l2 metrics are not offered).

Scope: transformers generation only; vLLM, continuous batching, a `rollout_func`, tools and environments are refused
(the mixed input cannot be fed there), and so are the flags whose forwards bypass the replay (see `validate`);
`logps_chunk_size` replays (its forward goes through the same embedding layer, rows in order).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..contracts import RolloutBatch
from ..registry import register
from ._exclusive import refuse_bypasses, refuse_own_forwards

VARIANT_ID = "n_grpo"
MIX_RATE, TOP_K, THINK_END = "n_grpo_mix_rate", "n_grpo_top_k", "n_grpo_think_end"
# Inputs computed by forwards of their own that would not see the mixed inputs.
_OWN_FORWARD_REQUIREMENTS = ("sum_pi_squared", "tempered_logps", "intra_group_token_divergence", "contrast_logps",
                             "dpo_logps", "teacher_logps", "prompt_kl")


def validate(config: Any) -> None:
    """Config-time checks of the `n_grpo_*` fields and of the generation path."""
    rate = getattr(config, MIX_RATE)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not (math.isfinite(rate) and 0 <= rate <= 1):
        raise ValueError(f"{MIX_RATE}={rate!r}: use a probability in [0, 1], the share of generation steps that mix "
                         "(official mix_rate 0.1; 0 = plain GRPO).")
    top_k = getattr(config, TOP_K)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"{TOP_K}={top_k!r}: use an integer >= 1, the mixed candidates including the anchor "
                         "(official mix_top_k 2 = anchor + its nearest neighbour).")
    end = getattr(config, THINK_END)
    if end is not None and (not isinstance(end, str) or not end):
        raise ValueError(f"{THINK_END}={end!r}: use the text after which no step mixes (official '</think>'), or None "
                         "to mix in the whole completion.")
    refused = {"use_vllm": "vLLM", "use_transformers_continuous_batching": "continuous batching",
               "generation_temperatures": "one generate call per temperature", "edge_grpo_gec": "GEC's rewritten rows",
               "prefix_grouper": "the shared-prefix forward", "use_liger_kernel": "the Liger loss's own forward"}
    refuse_bypasses(config, VARIANT_ID, refused, "feeds mixed embeddings through transformers' generate and replays "
                    "them in the log-prob forwards", "does not do")
    refuse_own_forwards(config, _OWN_FORWARD_REQUIREMENTS, f"replay rollout_filter={VARIANT_ID!r}'s mixed inputs")


def sampling_probs(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """`(B, V)` logits → the `(B, V)` distribution the weights read: softmax of `z / T` after top-k and top-p."""
    z = logits.float() / max(float(temperature), 1e-6)
    if top_k is not None and 0 < top_k < z.size(-1):
        kth = z.topk(top_k, dim=-1).values[:, -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p is not None and 0 < top_p < 1:
        sorted_z, order = z.sort(dim=-1, descending=True)
        sorted_p = sorted_z.softmax(-1)
        drop = (sorted_p.cumsum(-1) - sorted_p) > top_p  # mass before the token already exceeds top_p
        z = z.scatter(-1, order, sorted_z.masked_fill(drop, float("-inf")))
    return z.softmax(-1)


def semantic_neighbours(unit_table: torch.Tensor, anchors: torch.Tensor, top_k: int) -> torch.Tensor:
    """`(B,)` anchor ids → `(B, top_k)` candidates: the anchor, then its `top_k - 1` most cosine-similar rows of the
    `(V, H)` row-normalised embedding table, the anchor itself excluded."""
    if top_k == 1:
        return anchors[:, None]
    similarity = unit_table[anchors] @ unit_table.T  # (B, V)
    similarity.scatter_(1, anchors[:, None], float("-inf"))
    return torch.cat([anchors[:, None], similarity.topk(top_k - 1, dim=-1).indices], dim=1)


def candidate_weights(probs: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """`(B, V)` probabilities, `(B, K)` candidates → `(B, K)` weights `p_c / Σ p_c` (the anchor's mass is > 0)."""
    picked = probs.gather(1, candidates)
    return picked / picked.sum(-1, keepdim=True).clamp(min=1e-12)


def mixed_embeddings(candidate_embeddings: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """`(..., K, H)` candidate embeddings, `(..., K)` weights → `(..., H)` `Σ_j w_j E_{c_j}` in the embeddings'
    dtype."""
    return (weights.to(candidate_embeddings.dtype).unsqueeze(-1) * candidate_embeddings).sum(-2)


@register(
    VARIANT_ID,
    name="N-GRPO (Semantic Neighbor Mixing): rollout inputs mixed with the anchor token's nearest embeddings",
    paper="N-GRPO: Embedding-Level Neighbor Mixing for Enhanced Policy Optimization, arXiv:2606.10768",
    official_code="ZJUSCL/N-GRPO@d9c94fe963a2448123bad68e4a9c208501c8a3d0:"
                  "src/sglang-0.4.6.post5/python/sglang/srt/layers/sampler.py",
    stage="sampling",
    flags={"rollout_filter": VARIANT_ID, MIX_RATE: 0.1, TOP_K: 2, THINK_END: "</think>"},
    params=(MIX_RATE, TOP_K, THINK_END),
    validate=validate,
)
def n_grpo(batch: RolloutBatch) -> torch.Tensor:
    """N-GRPO changes how rollouts are generated and replayed (module docstring), not which are kept: this is the
    stage's filter on the mixed batch and keeps every rollout, so the variant composes with every advantage
    estimator, token weighting and objective whose forwards replay the mix, but not with another `rollout_filter`.

    Args:
        batch (`RolloutBatch`): the global batch of rollouts.

    Returns:
        `torch.Tensor`: `(N,)` bool keep mask, all True.
    """
    if torch.isinf(batch.rewards).any():
        raise ValueError(
            f"rollout_filter={VARIANT_ID!r} got ±inf rewards; reward functions must return finite values or NaN."
        )
    return torch.ones(batch.rewards.shape[0], dtype=torch.bool, device=batch.rewards.device)
