"""Variable group sizes: a generation batch whose prompts get different numbers of rollouts.

TRL 1.16 gives every prompt `num_generations` rollouts: its `RepeatSampler` repeats each prompt G times and its
advantage code views the rewards as `(N / G, G)`. A variant that sizes each prompt's group on its own (sGPO's
`G_x = 1/p̂_x`) keeps TRL's *row* budget instead: a generation batch still has `generation_batch_size` rows over
all processes, but they are dealt to prompts in groups of sizes `G_1 … G_M` (`Σ G_j = generation_batch_size`, M
varies from batch to batch). Nothing else in TRL's batch layout changes, so TRL's generation, reward calls,
shuffling and splitting into steps run as they are.

How a variant asks for it. A prompt selection (`prompt_sampler.prompt_selection`) returns `(indices, sizes)`
instead of `indices`; the seam checks the sizes, deals `sizes[j]` copies of prompt `indices[j]` in order (a group
may straddle two processes: every group statistic below is taken on the gathered batch), records the sizes in the
variant's state (`pending_sizes`) and hands the trainer a `GroupLayout` for that batch. The rollout stages then
use the layout wherever they would reshape by G:

- the sampling filter sees `RolloutBatch.group_sizes`;
- the advantages are GRPO's (or GDPO's `normalize_then_sum`), computed group by group
  (`variable_group_normalized_advantages`, `variable_group_decoupled_advantages`); with every size equal to G they
  are TRL's numbers bit for bit (tested); an advantage estimator that only reads its own group's rewards
  (`GROUP_LOCAL_ESTIMATORS`: RLOO, softmax, pass@k, MC-GRPO, …) runs group by group;
- TRL's `frac_reward_zero_std` metric, computed on TRL's fixed-size view, is replaced by the true fraction.

What does not take variable groups. Every other stage input that assumes `(N / G, G)`: the other advantage
estimators, the token-weight variants that read groups (those that do not, `GROUP_AGNOSTIC_TOKEN_WEIGHTS`, run
unchanged), per-slot temperatures (`generation_temperatures`), objectives that read group structure (`group_structure`, SRPO's sibling routing) and
Balanced Aggregation, EDGE-GRPO's GEC. `check_variable_groups` refuses them at config time, naming the flag that
turns the variable sizes off. vLLM (which generates `num_generations` per unique prompt) is refused by the variants
that use this seam.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..contracts import nan_std
from ..registry import get_variant

# TRL 1.16 adds this to the std before dividing (same constant as `advantages.group_norm.TRL_STD_EPS`).
_TRL_STD_EPS = 1e-4
# Objective requirements that read a row's group (ids or siblings) from the `(N / G, G)` layout.
_GROUP_READING_REQUIREMENTS = ("group_structure", "self_teacher_topk")


def _always(config: Any) -> bool:
    return True


#: Advantage estimators whose advantages for a group depend on that group's rewards alone (no batch statistic, no
#: state, no per-slot meaning), with the config under which that holds: with variable groups they run group by group
#: (`per_group_advantages`). `tests/unit/sampling/test_group_layout.py` checks each one: its advantages on a batch equal
#: its advantages on each group of the batch.
GROUP_LOCAL_ESTIMATORS: dict[str, Callable[[Any], bool]] = {
    "rloo": _always, "softmax_grpo": _always, "std_dial": _always, "two_grpo": _always, "gopo": _always,
    "grpo_passk": _always, "mc_grpo": _always, "sign_adv": _always, "mdp_grpo": _always,
    "focal_tailmiss": lambda config: config.scale_rewards != "batch",  # its batch mode divides by the batch's std
}


#: Token-weight variants that never read a row's group (they check only that the batch splits into groups of
#: `num_generations`, which a variable-group batch of `generation_batch_size` rows still does), with the config under
#: which that holds: with variable groups they run unchanged. `tests/unit/sampling/test_group_layout.py` checks that
#: their output does not change with the group size they are told.
GROUP_AGNOSTIC_TOKEN_WEIGHTS: dict[str, Callable[[Any], bool]] = {
    "frpo": _always, "lopti": _always, "mu_grpo": _always, "stapo": _always, "d3s_token": _always, "nat": _always,
    "temporal_credit": _always,
    "wapo": lambda config: not config.wapo_positive_group_scale,  # its scale counts the groups with a positive row
}


def group_local(variant_id: str, config: Any) -> bool:
    """Whether advantage estimator `variant_id` runs group by group under `config` (`GROUP_LOCAL_ESTIMATORS`)."""
    return GROUP_LOCAL_ESTIMATORS.get(variant_id, lambda _: False)(config)


def per_group_advantages(estimate: Callable[[torch.Tensor, int], Any], rewards: torch.Tensor, sizes: torch.Tensor
                         ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """A group-local estimator over groups of sizes `G_1 … G_M`: `estimate(rewards_j, G_j)` on each group, the results
    concatenated (and the keep masks, for an estimator that returns `(advantages, keep)`: MC-GRPO's pivot)."""
    results = [estimate(group, group.shape[0]) for group in _per_group(rewards, sizes)]
    if isinstance(results[0], tuple):
        return torch.cat([r[0] for r in results]), torch.cat([r[1] for r in results])
    return torch.cat(results)


@dataclass(frozen=True)
class GroupLayout:
    """Sizes of the consecutive groups of one global generation batch.

    Attributes:
        sizes (`torch.Tensor`): `(M,)` int64, each ≥ 1; group `j` owns rows `Σ_{i<j} G_i … Σ_{i≤j} G_i − 1`.
    """

    sizes: torch.Tensor

    @classmethod
    def from_sizes(cls, sizes: Sequence[int] | torch.Tensor, num_rows: int, owner: str) -> GroupLayout:
        """Checked layout: integer sizes ≥ 1 summing to `num_rows` (else a `ValueError` naming `owner`)."""
        sizes = torch.as_tensor(list(sizes) if not isinstance(sizes, torch.Tensor) else sizes)
        if sizes.dim() != 1 or sizes.numel() == 0 or sizes.dtype.is_floating_point or (sizes < 1).any():
            raise ValueError(f"{owner}: group sizes must be a non-empty list of integers ≥ 1, got {sizes.tolist()}.")
        if int(sizes.sum()) != num_rows:
            raise ValueError(f"{owner}: group sizes {sizes.tolist()} sum to {int(sizes.sum())}, but the generation "
                             f"batch has {num_rows} rows (generation_batch_size).")
        return cls(sizes.to(torch.int64))

    @property
    def num_rows(self) -> int:
        return int(self.sizes.sum())

    def group_ids(self) -> torch.Tensor:
        """`(N,)` int64: the group of each row."""
        return torch.repeat_interleave(torch.arange(self.sizes.numel()), self.sizes)


def _per_group(values: torch.Tensor, sizes: torch.Tensor) -> tuple[torch.Tensor, ...]:
    if values.shape[0] != int(sizes.sum()):
        raise ValueError(f"{values.shape[0]} rollouts for group sizes summing to {int(sizes.sum())}.")
    return torch.split(values, sizes.tolist())


def variable_group_normalized_advantages(
    rewards: torch.Tensor, sizes: torch.Tensor, *, scale_rewards: str = "group", eps: float = _TRL_STD_EPS
) -> torch.Tensor:
    """GRPO's group-relative advantage over groups of sizes `G_1 … G_M`.

    `A_i = (r_i − mean_{g(i)}(r)) / (std + eps)`, with `std` the unbiased std of row i's group (`"group"`), of the
    whole batch (`"batch"`), or no division (`"none"`); means and stds skip NaN rewards, and a NaN reward, a group
    of one row, or a group with one scored row gets advantage 0 (as TRL's `nanstd` gives NaN there). Each group is
    reduced on its own slice with TRL's reductions, so equal sizes reproduce `group_normalized_advantages`.

    Args:
        rewards (`torch.Tensor`): `(N,)` rewards, groups contiguous.
        sizes (`torch.Tensor`): `(M,)` group sizes, `Σ G_j = N`.
        scale_rewards (`str`): `"group"`, `"batch"` or `"none"`.
        eps (`float`): added to the std (TRL: 1e-4).

    Returns:
        `torch.Tensor`: `(N,)` advantages.
    """
    if scale_rewards not in ("group", "batch", "none"):
        raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale_rewards!r}.")
    pieces = []
    for group in _per_group(rewards, sizes):
        centred = group - torch.nanmean(group)
        if scale_rewards == "group":
            std = nan_std(group) if group.numel() > 1 else torch.zeros((), dtype=group.dtype)
            centred = centred / (std + eps)
        pieces.append(centred)
    advantages = torch.cat(pieces)
    if scale_rewards == "batch":
        std = nan_std(rewards) if rewards.numel() > 1 else torch.zeros(())
        advantages = advantages / (std + eps)
    return torch.nan_to_num(advantages, nan=0.0)


def variable_group_decoupled_advantages(
    rewards_per_func: torch.Tensor, sizes: torch.Tensor, *, reward_weights: torch.Tensor | None = None,
    eps: float = _TRL_STD_EPS,
) -> torch.Tensor:
    """GDPO's `normalize_then_sum` over groups of sizes `G_1 … G_M`: each reward function z-scored within its group
    (`z_ik = (r_ik − mean_g(r_k)) / (std_g(r_k) + eps)`, std 0 for a one-row group), `s_i = Σ_k w_k z_ik` (NaN when
    every function is NaN), `A = (s − mean(s)) / (std(s) + eps)` over the batch; NaN → 0.

    Args:
        rewards_per_func (`torch.Tensor`): `(N, K)`, NaN where a function returned None.
        sizes (`torch.Tensor`): `(M,)` group sizes.
        reward_weights (`torch.Tensor` or `None`): `(K,)`, default all ones.
        eps (`float`): added to the stds.

    Returns:
        `torch.Tensor`: `(N,)` advantages.
    """
    weights = torch.ones(rewards_per_func.shape[1]) if reward_weights is None else reward_weights
    pieces = []
    for group in _per_group(rewards_per_func, sizes):
        mean = torch.nanmean(group, dim=0, keepdim=True)
        std = nan_std(group, dim=0, keepdim=True) if group.shape[0] > 1 else torch.zeros_like(mean)
        pieces.append((group - mean) / (std + eps))
    z = torch.cat(pieces)
    summed = (z * weights.to(z)).nansum(dim=1)
    summed[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    std = nan_std(summed) if summed.numel() > 1 else torch.zeros(())
    return torch.nan_to_num((summed - torch.nanmean(summed)) / (std + eps), nan=0.0)


def zero_std_fraction(rewards: torch.Tensor, sizes: torch.Tensor) -> float:
    """Fraction of rows whose group's rewards have zero std (TRL's `frac_reward_zero_std`, on the true groups)."""
    flags = []
    for group in _per_group(rewards, sizes):
        std = nan_std(group) if group.numel() > 1 else torch.zeros(())
        flags.append(torch.isclose(std, torch.zeros_like(std)).expand(group.numel()))
    return torch.cat(flags).float().mean().item()


def check_variable_groups(config: Any, switch: str) -> None:
    """Config-time refusals of a run whose groups vary in size; `switch` names the setting that makes them vary
    (e.g. `"sgpo_group_size='inverse_success'"`) and appears in every message as the way out."""
    fix = f"set {switch.split('=')[0]} to its fixed-size value or drop"
    active = config.active_variants()
    allowed = {"advantages": group_local,
               "token_weights": lambda vid, cfg: GROUP_AGNOSTIC_TOKEN_WEIGHTS.get(vid, lambda _: False)(cfg)}
    for stage in ("advantages", "token_weights"):
        if stage in active and not allowed[stage](active[stage], config):
            variant = get_variant(active[stage])
            raise ValueError(f"{switch} gives prompts groups of different sizes, but {variant.selector}="
                             f"{variant.id!r} reads groups as (N / num_generations, num_generations) rows; {fix} "
                             f"{variant.selector}. Variable groups train with GRPO's (or GDPO's) group advantages, "
                             f"an estimator that works group by group ({sorted(GROUP_LOCAL_ESTIMATORS)}) and token "
                             f"weights that read no group ({sorted(GROUP_AGNOSTIC_TOKEN_WEIGHTS)}).")
    if getattr(config, "generation_temperatures", None):
        raise ValueError(f"{switch} gives prompts groups of different sizes, but generation_temperatures assigns a "
                         f"temperature to each slot of a num_generations group; {fix} generation_temperatures.")
    if "objective" in active:
        variant = get_variant(active["objective"])
        needs = sorted(set(variant.requires) & set(_GROUP_READING_REQUIREMENTS))
        if needs:
            raise ValueError(f"{switch} gives prompts groups of different sizes, but loss_type={variant.id!r} reads "
                             f"each rollout's group ({needs}) from fixed-size groups; {fix} that loss_type.")
        from ..objective.aggregation import resolved_aggregation

        if resolved_aggregation(config) == "balanced":
            raise ValueError(f"{switch} gives prompts groups of different sizes, but loss_aggregation='balanced' forms "
                             f"its sign classes over fixed-size groups; {fix} loss_aggregation='balanced'.")
    if getattr(config, "edge_grpo_gec", False):
        raise ValueError(f"{switch} gives prompts groups of different sizes, but edge_grpo_gec=True corrects "
                         f"responses within fixed-size groups; {fix} edge_grpo_gec.")
