"""DAPO's soft overlong punishment (length-aware penalty for truncated / near-limit completions)."""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["DAPOOverlongReward", "dapo_overlong_reward"]

#: DAPO's setting: L_max = 20480 tokens with an L_cache = 4096-token punishment buffer (paper §3.4), i.e. 20 %.
DAPO_CACHE_FRACTION = 4096 / 20480


class DAPOOverlongReward:
    r"""DAPO soft overlong punishment (Yu et al., DAPO, arXiv:2503.14476, Eq. 13), added to the task reward:

        R_len(y) = 0                                   if |y| <= L_max - L_cache
                 = ((L_max - L_cache) - |y|) / L_cache if L_max - L_cache < |y| <= L_max
                 = -1                                  if |y| > L_max

    times ``penalty_factor`` (1.0 in DAPO). |y| is the number of completion tokens (``completion_ids``).

    This wraps TRL's ``trl.rewards.get_soft_overlong_punishment`` (which is Eq. 13 exactly) and adds verl's
    ``penalty_factor``. Official code (verl, the DAPO recipe's reward manager):
    verl-project/verl@1dda039b9c6311889a9c9a26040677e1254814f9:verl/workers/reward_manager/dapo.py:
    DAPORewardManager.__call__ l.121-127: ``expected_len = max_resp_len - overlong_buffer.len``,
    ``overlong_reward = min(-(|y| - expected_len) / overlong_buffer.len * penalty_factor, 0)`` added to the score.
    The two agree for |y| <= L_max; verl never sees |y| > L_max (responses are truncated at ``max_resp_len``),
    where we follow the paper's -1 (times ``penalty_factor``).

    Defaults (our choice, documented): ``max_completion_len=None`` takes the trainer's ``max_completion_length``
    when the recipe runner binds the reward (``bind(args)``); ``soft_punish_cache=None`` takes DAPO's ratio,
    L_cache = round(0.2 · L_max) (4096 / 20480). Calling an unbound instance without ``max_completion_len`` is
    an error.
    """

    __name__ = "dapo_overlong_reward"

    def __init__(self, max_completion_len: int | None = None, soft_punish_cache: int | None = None,
                 penalty_factor: float = 1.0):
        if max_completion_len is not None and max_completion_len <= 0:
            raise ValueError(f"max_completion_len must be positive, got {max_completion_len}.")
        if soft_punish_cache is not None and not (
            0 < soft_punish_cache <= (max_completion_len if max_completion_len is not None else soft_punish_cache)
        ):
            raise ValueError(
                f"soft_punish_cache must be in (0, max_completion_len], got {soft_punish_cache} "
                f"(max_completion_len={max_completion_len})."
            )
        if penalty_factor < 0:
            raise ValueError(f"penalty_factor must be >= 0, got {penalty_factor}.")
        self.max_completion_len = max_completion_len
        self.soft_punish_cache = soft_punish_cache
        self.penalty_factor = penalty_factor

    def bind(self, args: Any) -> DAPOOverlongReward:
        """A copy with ``max_completion_len`` taken from the training arguments when it was left unset."""
        bound = copy.copy(self)
        if bound.max_completion_len is None:
            bound.max_completion_len = int(args.max_completion_length)
        return bound

    def _cache(self) -> int:
        if self.soft_punish_cache is not None:
            return self.soft_punish_cache
        return max(1, round(DAPO_CACHE_FRACTION * self.max_completion_len))

    def __call__(self, prompts=None, completions=None, completion_ids=None, **kwargs: Any) -> list[float]:
        from trl.rewards import get_soft_overlong_punishment

        if self.max_completion_len is None:
            raise ValueError(
                "dapo_overlong_reward: max_completion_len is unset; construct DAPOOverlongReward(max_completion_len=...)"
                " or let the recipe runner bind it to --max_completion_length."
            )
        if completion_ids is None:
            raise ValueError("dapo_overlong_reward needs completion_ids (passed by GRPOTrainer).")
        punish = get_soft_overlong_punishment(self.max_completion_len, self._cache())
        return [float(self.penalty_factor * r) for r in punish(completion_ids=completion_ids)]


#: Registered instance: L_max bound to the trainer's ``max_completion_length``, L_cache = 0.2·L_max, factor 1.
dapo_overlong_reward = DAPOOverlongReward()
