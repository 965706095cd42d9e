"""Visual-RFT verifiable perception rewards, for boxes written as text: IoU reward and label match."""

from __future__ import annotations

import math
import re
from typing import Any

from ._utils import answer_text, column, completion_text, normalize_text

__all__ = ["IoUReward", "box_iou", "iou_reward", "label_match_reward", "matched_iou", "parse_boxes"]

_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_BOX = re.compile(rf"[\[(]\s*({_NUM})\s*,\s*({_NUM})\s*,\s*({_NUM})\s*,\s*({_NUM})\s*[\])]")

Box = tuple[float, float, float, float]


def parse_boxes(value: Any) -> list[Box]:
    """Boxes ``[x1, y1, x2, y2]`` from text (every bracketed or parenthesised 4-number group) or from a list of
    4-number sequences. Non-finite numbers are dropped."""
    if value is None:
        return []
    if isinstance(value, str):
        boxes = [tuple(float(g) for g in m.groups()) for m in _BOX.finditer(value)]
    else:
        items = list(value)
        if len(items) == 4 and all(isinstance(v, (int, float)) for v in items):
            items = [items]
        boxes = [tuple(float(v) for v in b) for b in items if len(b) == 4]
    return [b for b in boxes if all(math.isfinite(v) for v in b)]


def box_iou(a: Box, b: Box) -> float:
    """Intersection over union of two ``(x1, y1, x2, y2)`` boxes; a degenerate box (x2 ≤ x1 or y2 ≤ y1) has area 0
    and IoU 0."""
    if a[2] <= a[0] or a[3] <= a[1] or b[2] <= b[0] or b[3] <= b[1]:
        return 0.0
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def matched_iou(pred: list[Box], gold: list[Box]) -> float:
    """Σ IoU over a greedy one-to-one matching (highest IoU pair first), divided by max(#pred, #gold): extra or
    missing boxes count as IoU 0. Both empty → 1 (nothing to detect, nothing predicted)."""
    if not pred and not gold:
        return 1.0
    if not pred or not gold:
        return 0.0
    pairs = sorted(((box_iou(p, g), i, j) for i, p in enumerate(pred) for j, g in enumerate(gold)), reverse=True)
    used_p, used_g, total = set(), set(), 0.0
    for iou, i, j in pairs:
        if iou <= 0.0:
            break
        if i not in used_p and j not in used_g:
            used_p.add(i)
            used_g.add(j)
            total += iou
    return total / max(len(pred), len(gold))


class IoUReward:
    """Visual-RFT IoU reward (Liu et al., "Visual-RFT: Visual Reinforcement Fine-Tuning", arXiv:2503.01785;
    catalog id ``visual_rft``) for boxes written as text: ``r = matched_iou(pred_boxes, gold_boxes)`` ∈ [0, 1].

    Predicted boxes are the ``[x1, y1, x2, y2]`` groups inside ``<answer>`` (else anywhere in the completion);
    gold boxes come from the ``solution`` column (text or list of boxes). The paper's abstract names "the IoU reward
    for object detection" without the matching rule; ours (our choice): greedy one-to-one matching by IoU, sum of
    matched IoUs divided by max(#pred, #gold), so extra boxes and missed boxes both cost. The paper's confidence
    term is not included. Identical boxes → 1; disjoint → 0; no box in the completion → 0; ``None`` gold → ``None``.
    The paper trains LVLMs on images; here the boxes are text, which any text model can be trained to emit.
    """

    __name__ = "iou_reward"

    def __init__(self, *, answer_tag: str | None = "answer"):
        self.answer_tag = answer_tag

    def __call__(self, prompts=None, completions=None, completion_ids=None, **kwargs: Any) -> list[float | None]:
        texts = [completion_text(c) for c in (completions or [])]
        gold_cells = column(kwargs, "solution", len(texts), "boxes")
        out: list[float | None] = []
        for text, gold in zip(texts, gold_cells, strict=True):
            if gold is None:
                out.append(None)
                continue
            out.append(matched_iou(parse_boxes(answer_text(text, self.answer_tag)), parse_boxes(gold)))
        return out


iou_reward = IoUReward()


def label_match_reward(prompts=None, completions=None, completion_ids=None, **kwargs: Any) -> list[float | None]:
    """Visual-RFT classification reward: 1 if the ``<answer>`` (else the whole completion), normalised (lower case,
    no punctuation, collapsed whitespace), equals the normalised ``label`` column (alias ``solution``), else 0;
    ``None`` label → ``None``."""
    texts = [completion_text(c) for c in (completions or [])]
    labels = column(kwargs, "label", len(texts), "solution")
    return [
        None if label is None else float(normalize_text(answer_text(t)) == normalize_text(str(label)))
        for t, label in zip(texts, labels, strict=True)
    ]
