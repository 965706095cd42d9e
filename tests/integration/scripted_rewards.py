"""Scripted reward functions for the variants that score a training batch twice per step: once as TRL generates it,
then again on the rows the variant rewrote (GCPO's injected references, EDGE-GRPO's corrected responses, LSPO's
scaffold re-rolls). Odd calls are the generated batch, even calls the re-scoring."""

from collections.abc import Callable, Sequence


def completion_text(completion) -> str:
    """The completion's text: the last message's content for conversational rows."""
    return completion[-1]["content"] if isinstance(completion, list) else completion


class FirstCallPattern:
    """Reward function: on a generated batch (odd calls) this process's row 0 scores 1 and every other row 0, so with
    rows in order group 0 is mixed and every other group fails entirely (`first_row_correct=False`: every row 0, as
    on the processes after the first in a two-process run). On a re-scoring (even calls) each row gets
    `rescore(texts, **dataset_columns)[i]`. `calls` keeps every call's completion texts.

    `name` is the reward's name in TRL's logs (`rewards/<name>/mean`)."""

    def __init__(self, rescore: Callable[..., Sequence[float]], name: str = "first_call_pattern",
                 first_row_correct: bool = True):
        self.rescore, self.__name__, self.first_row_correct = rescore, name, first_row_correct
        self.calls: list[list[str]] = []

    def __call__(self, completions, **kwargs) -> list[float]:
        texts = [completion_text(c) for c in completions]
        self.calls.append(texts)
        if len(self.calls) % 2 == 1:
            return [float(self.first_row_correct and i == 0) for i in range(len(texts))]
        return [float(r) for r in self.rescore(texts, **kwargs)]
