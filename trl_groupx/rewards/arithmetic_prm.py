"""A tiny rule-based process reward ("PRM") for the toy arithmetic task, for tests and recipes of the variants that
read a process-reward column (`advantage_estimator="papo"`, `"verigate"`)."""

from __future__ import annotations

from typing import Any

from ._utils import column, completion_text

__all__ = ["arithmetic_prefix_prm"]


def arithmetic_prefix_prm(prompts=None, completions=None, completion_ids=None, **kwargs: Any) -> list[float | None]:
    """Partial credit for an arithmetic answer, digit by digit from the left (a rule-based stand-in for a PRM):

        score = (number of leading characters of the stripped completion that match the reference answer)
                / max(len(completion), len(answer))

    in ``[0, 1]``: 1.0 exactly when the completion is the answer, ``"1"`` for ``"19"`` gives 0.5, ``"197"`` gives
    2/3 (extra characters cost), ``"91"`` gives 0, an empty completion gives 0. Reads the ``answer`` column
    (``trl_groupx.toy.arithmetic_dataset``); a row without a reference answer gets ``None`` (TRL: NaN, unscored).

    It is a process *proxy* (how far the generated digits follow the right ones), not a learned PRM: the PAPO paper
    uses a rubric-based LLM judge scoring 0 / 0.5 / 1; pass your own judge as a reward function in real runs.
    """
    answers = column(kwargs, "answer", len(completions))
    scores: list[float | None] = []
    for completion, answer in zip(completions, answers, strict=True):
        if answer is None:
            scores.append(None)
            continue
        text, target = completion_text(completion).strip(), str(answer).strip()
        if not target:
            scores.append(None)
            continue
        matched = 0
        for got, want in zip(text, target):
            if got != want:
                break
            matched += 1
        scores.append(matched / max(len(text), len(target)))
    return scores


#: Written for the toy task itself: `trl-groupx grpo --toy` keeps it (the toy run swaps the other rewards).
arithmetic_prefix_prm.toy_task = True
