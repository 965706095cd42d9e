"""Joint team reward of multi-agent CTDE GRPO: quality − time cost − coordination cost, shared by the team."""

from __future__ import annotations

import copy
import re
from typing import Any

from ._utils import answer_text, column, completion_text
from .math import math_equal

__all__ = ["JointTeamReward", "joint_team_reward"]


class JointTeamReward:
    r"""Joint team reward (catalog id ``ctde_marl``, arXiv:2512.24609: cooperation as a Dec-POMDP with centralised
    training and decentralised execution; GRPO with "a simplified joint reward that balances task quality, speed,
    and coordination cost").

        R = quality − λ_time · time − λ_coord · messages

    one scalar for the whole team episode (every agent's tokens share it: the CTDE credit). Text version, for a
    completion that holds the team transcript with inter-agent messages marked ``<msg>…</msg>`` and the team's
    final output in ``<answer>``:

    * ``quality`` ∈ {0, 1}: math-verify equality of the ``<answer>`` content and the ``solution`` column (an
      environment can instead pass a per-rollout ``team_quality`` column, any real score);
    * ``time`` = completion tokens / ``max_completion_length`` ∈ [0, 1] (or a ``team_latency`` column, e.g.
      wall-clock seconds of the episode);
    * ``messages`` = number of ``<msg>`` sections (or a ``team_messages`` column).

    The paper's form and weights were not public (official-code notes: "underspecified"); λ_time = 0.1 and
    λ_coord = 0.05 per message are our defaults. Monotone: R falls with coordination cost and time, rises with
    quality. ``None`` quality (no solution and no ``team_quality``) → ``None``.
    """

    __name__ = "joint_team_reward"

    def __init__(self, *, lambda_time: float = 0.1, lambda_coord: float = 0.05, max_completion_len: int | None = None,
                 message_tag: str = "msg"):
        if lambda_time < 0 or lambda_coord < 0:
            raise ValueError("lambda_time and lambda_coord must be >= 0.")
        self.lambda_time, self.lambda_coord = lambda_time, lambda_coord
        self.max_completion_len = max_completion_len
        self.message_tag = message_tag

    def bind(self, args: Any) -> JointTeamReward:
        bound = copy.copy(self)
        if bound.max_completion_len is None:
            bound.max_completion_len = int(args.max_completion_length)
        return bound

    def __call__(self, prompts=None, completions=None, completion_ids=None, **kwargs: Any) -> list[float | None]:
        texts = [completion_text(c) for c in (completions or [])]
        n = len(texts)
        quality = column(kwargs, "team_quality", n)
        latency = column(kwargs, "team_latency", n)
        messages = column(kwargs, "team_messages", n)
        verified = math_equal([answer_text(t) for t in texts], column(kwargs, "solution", n))
        ids = completion_ids if completion_ids is not None else [None] * n
        out: list[float | None] = []
        for i, text in enumerate(texts):
            q = quality[i] if quality[i] is not None else verified[i]
            if q is None:
                out.append(None)
                continue
            if latency[i] is not None:
                t = float(latency[i])
            else:
                n_tokens = len(ids[i]) if ids[i] is not None else len(text.split())
                t = n_tokens / self.max_completion_len if self.max_completion_len else 0.0
            m = messages[i] if messages[i] is not None else len(
                re.findall(rf"<{re.escape(self.message_tag)}>.*?</{re.escape(self.message_tag)}>", text, re.DOTALL))
            out.append(float(q) - self.lambda_time * t - self.lambda_coord * float(m))
        return out


joint_team_reward = JointTeamReward()
