"""Rollout structures: TRL 1.16 `rollout_func` factories that change what one rollout is, selected in a recipe with
`rollout: <name>` (`trl-groupx grpo`) or passed as `GRPOTrainer(rollout_func=...)`.

They are not stage variants (no config selector dispatches them): a rollout structure decides what is generated
and what travels to the reward functions, and the stages run unchanged on its rows. `trl-groupx list` shows them
after the registered variants.
"""

from __future__ import annotations

from dataclasses import dataclass

from .multi_round import make_multi_round_rollout


@dataclass(frozen=True)
class RolloutInfo:
    """A named rollout structure: the recipe name, the catalog id it implements, and its citation."""

    name: str
    catalog_id: str
    title: str
    paper: str
    official_code: str | None
    rewards: tuple[str, ...]


#: Recipe name (`rollout:`) → what it implements. The factories live in `trl_groupx.script._rollouts`.
ROLLOUT_INFO: dict[str, RolloutInfo] = {
    "multi_round": RolloutInfo(
        name="multi_round",
        catalog_id="motif",
        title="MOTIF (Modular Thinking via Reinforcement Finetuning): multi-round thinking, round 1 trained on the "
              "outcome of the later rounds",
        paper="MOTIF: Modular Thinking via Reinforcement Fine-tuning in LLMs, arXiv:2507.02851",
        official_code="purbeshmitra/MOTIF@4838e9ea876c9a135d9b2737eb05b9c86c362b18:motif.py",
        rewards=("motif_outcome_reward",),
    ),
}


def format_rollouts() -> str:
    """The rollout structures as text, in the style of `trl-groupx list`."""
    blocks = []
    for info in ROLLOUT_INFO.values():
        blocks.append("\n".join([
            f"{info.catalog_id}  [rollout]",
            f"    title: {info.title}",
            f"    paper: {info.paper}",
            f"    flags: rollout={info.name!r} (recipe), num_rounds=k; reward_funcs: {', '.join(info.rewards)}",
            f"    code:  {info.official_code or '-'}",
        ]))
    return "\n".join(blocks)


__all__ = ["ROLLOUT_INFO", "RolloutInfo", "format_rollouts", "make_multi_round_rollout"]
