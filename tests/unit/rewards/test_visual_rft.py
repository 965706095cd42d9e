"""visual_rft: IoU of boxes written as text, label match."""

import pytest

from trl_groupx.rewards import iou_reward, label_match_reward
from trl_groupx.rewards.visual_rft import box_iou, matched_iou, parse_boxes


def test_catalog_checks():
    assert iou_reward(completions=["[0, 0, 10, 10]", "[20,20,30,30]"], solution=["[0,0,10,10]"] * 2) == [1.0, 0.0]


def test_hand_iou():
    # [0,0,2,2] vs [1,0,3,2]: intersection 1×2 = 2, union 4 + 4 − 2 = 6 → 1/3
    assert box_iou((0, 0, 2, 2), (1, 0, 3, 2)) == pytest.approx(1 / 3)
    assert box_iou((2, 2, 0, 0), (0, 0, 2, 2)) == 0.0  # degenerate box
    # two gold, one perfect pred + one extra wrong pred + nothing for gold 2 : (1 + 0)/max(2, 2) = 0.5
    gold = [(0, 0, 2, 2), (10, 10, 12, 12)]
    assert matched_iou([(0, 0, 2, 2), (50, 50, 60, 60)], gold) == 0.5
    # greedy one-to-one: two preds on the same gold box only count once: (1 + 0)/2
    assert matched_iou([(0, 0, 2, 2), (0, 0, 2, 2)], [(0, 0, 2, 2)]) == 0.5
    assert matched_iou([], []) == 1.0 and matched_iou([], gold) == 0.0


def test_parsing_and_edges():
    assert parse_boxes("boxes: [1, 2.5, 3e1, 4] and (5,6,7,8), [1,2,3]") == [(1, 2.5, 30, 4), (5, 6, 7, 8)]
    assert parse_boxes([[0, 0, 1, 1]]) == [(0, 0, 1, 1)] and parse_boxes([0, 0, 1, 1]) == [(0, 0, 1, 1)]
    out = iou_reward(
        completions=["", "<think>[0,0,9,9]</think><answer>[0,0,10,10]</answer>", "no box here",
                     [{"role": "assistant", "content": "[0,0,10,10]"}], "[0,0,1,1]"],
        solution=["[0,0,10,10]", [[0, 0, 10, 10]], "[0,0,10,10]", "[0,0,10,10]", None],
    )
    assert out == [0.0, 1.0, 0.0, 1.0, None]  # the <answer> box is used, not the one in <think>


def test_label_match():
    out = label_match_reward(completions=["<answer>Red-winged Blackbird</answer>", "sparrow", "", "x"],
                             label=["red winged blackbird", "Robin", "robin", None])
    assert out == [1.0, 0.0, 0.0, None]
