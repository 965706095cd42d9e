"""MOTIF's outcome reward (official `total_reward_func`, purbeshmitra/MOTIF@4838e9ea:motif.py l.213-214)."""

import pytest

from trl_groupx.rewards import APPLICATION_REWARDS, REWARD_FUNCS, motif_outcome_reward
from trl_groupx.rewards.motif import motif_trajectory_score

IN_ANSWER = "<reasoning>\nr\n</reasoning>\n<answer>\n\\boxed{5}\n</answer>\n"
OUTSIDE = "<reasoning>\nso \\boxed{5}\n</reasoning>\n<answer>\nfive\n</answer>\n"
WRONG = "<answer>\n\\boxed{6}\n</answer>"


def test_trajectory_scores_two_one_zero():
    assert motif_trajectory_score(IN_ANSWER, "5") == 2.0  # boxed answer inside the <answer> tag
    assert motif_trajectory_score(OUTSIDE, "5") == 1.0  # boxed answer elsewhere in the final round
    assert motif_trajectory_score(WRONG, "5") == 0.0
    assert motif_trajectory_score("\\boxed{5}", "5") == 2.0  # no tag: the whole text is the "answer" (official)
    assert motif_trajectory_score("\\boxed{15}", "5") == 0.0  # substring test on "\boxed{5}", not on "5"


def test_row_reward_is_the_mean_over_futures():
    finals = [[IN_ANSWER, OUTSIDE, WRONG, WRONG], [OUTSIDE], [IN_ANSWER, IN_ANSWER]]
    # (2 + 1 + 0 + 0) / 4 = 0.75; 1 / 1; (2 + 2) / 2
    assert motif_outcome_reward([None] * 3, answer=["5", "5", "5"], multi_round_final=finals) == [0.75, 1.0, 2.0]


def test_raw_gsm8k_answer_is_reduced_to_the_number_after_hashes():
    assert motif_outcome_reward([None], answer=["3 + 2 = 5\n#### 5"], multi_round_final=[[IN_ANSWER]]) == [2.0]


def test_rows_without_answer_or_futures_get_no_score_and_missing_fields_fail():
    assert motif_outcome_reward([None, None], answer=[None, "5"], multi_round_final=[[IN_ANSWER], []]) == [None, None]
    with pytest.raises(ValueError, match="multi_round_final"):
        motif_outcome_reward([None], answer=["5"])
    with pytest.raises(ValueError, match="answer"):
        motif_outcome_reward([None], multi_round_final=[[IN_ANSWER]])


def test_registered_by_name_for_recipes():
    assert REWARD_FUNCS["motif_outcome_reward"] is motif_outcome_reward
    assert APPLICATION_REWARDS["motif"] == ("motif_outcome_reward",)
