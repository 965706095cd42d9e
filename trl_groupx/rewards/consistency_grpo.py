"""Paraphrase-stability reward (GRPO for information consistency across equivalent prompts)."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any

from ._utils import answer_text, column, completion_text, normalize_text

__all__ = ["StabilityReward", "stability_reward"]


def _key(prompt: Any) -> str:
    return completion_text(prompt)  # plain prompt, or the concatenated contents of a conversational prompt


class StabilityReward:
    r"""Stability reward of "GRPO for information consistency" (catalog id ``consistency_grpo``, arXiv:2512.12858):
    completions to semantically equivalent prompt variants should carry the same information.

    For the completions that share a ``paraphrase_id`` in the batch (a paraphrase group, n members), let ``a_i`` be
    the normalised information content of completion i (``<answer>`` content, else the whole text; lower case, no
    punctuation, collapsed whitespace) and ``p_i = #{j : a_j = a_i} / n`` its share in the group. Then

        r_i = 1 − (−log p_i) / log n      (n ≥ 2);    r_i = 1 (n = 1)

    so r ∈ [0, 1], all-identical answers give every member the maximum 1, a lone deviating answer gets 0 when the
    other members all differ from each other too, and the group mean of r is 1 − H / log n with H the entropy of
    the group's answer distribution: the paper's "entropy-based stability" (its exact formula, α·H_norm + β·F_norm,
    has no public code and the weights and the helpfulness part were not readable; this per-completion surprisal
    form is our choice, so that the reward still differs between members of one group and GRPO gets a gradient).

    Groups: the ``paraphrase_id`` column; without it (or ``None`` cells) the prompt text is the id (samples of one
    prompt). Only the completions that TRL hands to one call are compared: for paraphrase groups spread across
    processes or batches, put each paraphrase group in one batch (the catalog's ``group_key="paraphrase_id"`` data
    stage, which this reward does not implement; ``rollout_filter="consistency_grpo"`` makes each GRPO group the
    rollouts of one row's paraphrases and sets ``paraphrase_id`` to the group). Empty answers count as their own
    (empty) content.
    """

    __name__ = "stability_reward"

    def __init__(self, *, answer_tag: str | None = "answer"):
        self.answer_tag = answer_tag

    def __call__(self, prompts=None, completions=None, completion_ids=None, **kwargs: Any) -> list[float]:
        texts = [completion_text(c) for c in (completions or [])]
        n = len(texts)
        ids = column(kwargs, "paraphrase_id", n)
        prompt_list = list(prompts) if prompts is not None else [None] * n
        groups = [("id", i) if i is not None else ("prompt", _key(p)) for i, p in zip(ids, prompt_list, strict=True)]
        contents = [normalize_text(answer_text(t, self.answer_tag)) for t in texts]
        members: dict[Any, list[int]] = defaultdict(list)
        for idx, g in enumerate(groups):
            members[g].append(idx)
        out = [1.0] * n
        for rows in members.values():
            size = len(rows)
            if size < 2:
                continue
            counts = Counter(contents[r] for r in rows)
            for r in rows:
                out[r] = 1.0 - (-math.log(counts[contents[r]] / size)) / math.log(size)
        return out


stability_reward = StabilityReward()
