"""Every reward is reachable by name from the recipe runner, documented, and each application paper has a recipe."""

import inspect
import pickle
from pathlib import Path
from types import SimpleNamespace

import yaml

from trl_groupx.rewards import APPLICATION_REWARDS, REWARD_FUNCS, bind_training_args
from trl_groupx.script import resolve_reward_funcs

RECIPES = Path(__file__).resolve().parents[3] / "recipes"


def test_names_resolve_without_imports():
    assert resolve_reward_funcs(sorted(REWARD_FUNCS), allow_imports=False) == [REWARD_FUNCS[n] for n in
                                                                               sorted(REWARD_FUNCS)]
    for names in APPLICATION_REWARDS.values():
        assert set(names) <= set(REWARD_FUNCS)


def test_documented_named_and_picklable():
    for name, func in REWARD_FUNCS.items():
        doc = inspect.getdoc(func) or ""
        assert len(doc) > 80, name
        assert func.__name__ == name
        assert pickle.loads(pickle.dumps(func)).__name__ == name  # TRL's async rollout worker pickles rewards


def test_every_application_reward_has_a_recipe():
    for paper_id, names in APPLICATION_REWARDS.items():
        recipe = yaml.safe_load((RECIPES / f"{paper_id}.yaml").read_text())
        assert set(names) & set(recipe["reward_funcs"]), paper_id


def test_empty_batch():
    for func in bind_training_args(list(REWARD_FUNCS.values()), SimpleNamespace(max_completion_length=8)):
        assert list(func(prompts=[], completions=[], completion_ids=[])) == []
