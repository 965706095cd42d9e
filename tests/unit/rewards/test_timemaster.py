"""timemaster: format (three sections in order, non-empty) + label accuracy."""

from trl_groupx.rewards import StructuredSectionsReward, structured_sections_reward

FULL = "<think>rising then flat</think>\n<class>Neuropathy</class>\n<extension>see a doctor</extension>"


def test_hand_values():
    comps = [FULL, FULL, "<think>x</think><class>neuropathy</class>", "<class>Healthy</class>",
             "<think>x</think><class></class><extension>y</extension>", ""]
    labels = ["neuropathy", "healthy", "Neuropathy", "healthy", "healthy", "healthy"]
    # full + right → 2 ; full + wrong → 1 ; missing section → format 0, right label → 1 ; class only, right → 1 ;
    # empty class → format 0, accuracy 0 → 0 ; empty completion → 0
    assert structured_sections_reward(completions=comps, label=labels) == [2.0, 1.0, 1.0, 1.0, 0.0, 0.0]


def test_edges_and_weights():
    assert structured_sections_reward(completions=[FULL], label=[None]) == [1.0]  # format only
    assert structured_sections_reward(completions=[[{"role": "assistant", "content": FULL}]],
                                      solution=["Neuropathy"]) == [2.0]
    r = StructuredSectionsReward(("reasoning", "label", "insight"), w_format=0.5, w_accuracy=1.0)
    assert r(completions=["<reasoning>a</reasoning><label>X</label><insight>b</insight>"], label=["x"]) == [1.5]
