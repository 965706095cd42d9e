"""Every recipe parses into our GRPOConfig and trains one step on the shipped tiny model (model, dataset and
rewards swapped for local ones with --toy; LoRA/QLoRA settings kept as the recipe has them)."""

from pathlib import Path

import pytest
import torch
import yaml

import trl_groupx
from tests.conftest import parity_reward
from trl_groupx.rewards import APPLICATION_REWARDS
from trl_groupx.script import build_trainer, make_parser, resolve_reward_funcs

# recipes/accelerate/ holds launcher configs (tests/integration/test_accelerate_configs.py), not training recipes
RECIPES = sorted(p for p in (Path(__file__).resolve().parents[2] / "recipes").rglob("*.yaml")
                 if p.parent.name != "accelerate")
CPU_OVERRIDES = ["--bf16", "false", "--use_cpu", "true", "--gradient_checkpointing", "false", "--max_steps", "1",
                 "--gradient_accumulation_steps", "1",
                 "--max_completion_length", "6", "--report_to", "none", "--save_strategy", "no", "--dtype", "float32"]


# The tiny model is not the papers' model: where a recipe's paper value cannot work on it, the toy check overrides
# it here (the recipe itself keeps the paper's value).
TOY_OVERRIDES = {
    "gtpo_conflict": ["--gtpo_conflict_entropy_max", "10.0"],  # toy entropies ~2.3 nats: 0.7 would drop everything
    "lopti": ["--temperature", "1.0"],  # at 0.7 the toy model's groups are all-equal: nothing to learn in one step
    "edge_grpo": ["--temperature", "1.0",  # same, at 0.6
                  # GEC: the toy dataset's reference column (the recipe's: solution)
                  "--edge_grpo_gec_answer_column", "answer", "--edge_grpo_gec_solution_column", "answer",
                  # the official reflect cue is ~30 tokens of the tiny tokenizer: too long for its 64 positions
                  "--edge_grpo_gec_reflect_cue", "?"],
    "thinkless": ["--temperature", "1.0"],  # same, at 0.6
    "gcpo_ref": ["--gcpo_ref_column", "answer"],  # the toy dataset's reference column (the recipe's: solution)
    "sage": ["--sage_column", "answer"],  # the toy dataset's reference column (the recipe's: solution)
    "sage_light": ["--sage_column", "answer"],
    "lspo": ["--lspo_column", "answer"],  # the toy dataset's reference column (the recipe's: solution)
    "belief_probe": ["--belief_probe_answer_column", "answer"],  # the toy dataset's answers (the recipe's: solution)
    "motif": ["--warmup_steps", "0"],  # warmup from lr 0: a one-step run would not move
    "igrpo": ["--igrpo_draft_template", " {draft}"],  # after the recipe's note the toy's refinements all score alike
    "spo_segment": ["--temperature", "1.0"],  # at 0.6 the toy's groups are all-equal and its tokens confident (no cut)
    # 600-token segments do not fit the toy's 6-token completions: 1-token segments, and more variety (as above)
    "spo_tree": ["--spo_segment_tree_segment_length", "1", "--temperature", "1.5"],
}


NATIVE = {v.id: v for v in trl_groupx.list_variants() if v.native}


def test_recipe_count():
    assert len(RECIPES) >= 4, [r.name for r in RECIPES]  # the recursive glob must see every recipe


def test_every_registered_variant_has_a_recipe():
    names = {r.stem for r in RECIPES}
    assert [v.id for v in trl_groupx.list_variants() if v.id not in names] == []


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_parses_and_trains_one_step(recipe, tmp_path, monkeypatch):
    # a reward that always mixes within a group, so that one step is guaranteed a gradient
    monkeypatch.setattr("trl_groupx.toy.arithmetic_reward", parity_reward)
    group_size = yaml.safe_load(recipe.read_text()).get("num_generations", 8)
    # at least two groups of the recipe's own group size, and at least 8 rollouts
    batch = ["--per_device_train_batch_size", str(group_size * max(2, -(-8 // group_size)))]
    script_args, training_args, model_args = make_parser().parse_args_and_config(
        ["--config", str(recipe), "--toy", "--output_dir", str(tmp_path), *CPU_OVERRIDES, *batch,
         *TOY_OVERRIDES.get(recipe.stem, [])]
    )
    # application papers run plain GRPO: their recipe switches on the paper's registered reward instead of a variant;
    # TRL's built-in presets are not dispatched by trl_groupx: their recipe sets the preset's registry flags
    native = NATIVE.get(recipe.stem)
    diagnostic = script_args.headroom_probe_prompts > 0  # webagent_headroom: plain GRPO + the headroom probe
    assert training_args.active_variants() or recipe.stem in APPLICATION_REWARDS or native or diagnostic, (
        f"{recipe.name} switches on no trl_groupx variant"
    )
    if native:
        assert all(getattr(training_args, k) == v for k, v in native.flags.items()), recipe.name
    if recipe.stem in APPLICATION_REWARDS:
        assert set(APPLICATION_REWARDS[recipe.stem]) & set(script_args.reward_funcs), recipe.name
    assert resolve_reward_funcs(script_args.reward_funcs, False)  # the recipe's own rewards resolve by name
    trainer = build_trainer(script_args, training_args, model_args)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    if diagnostic:  # logged once, before the first step
        assert sum("headroom/headroom" in h for h in trainer.state.log_history) == 1
    assert model_args.use_peft and any("lora" in n for n in before)
    moved = [n for n, p in trainer.model.named_parameters() if p.requires_grad and not torch.equal(before[n], p)]
    assert moved


def test_unknown_reward_and_imports_need_opt_in():
    with pytest.raises(ValueError, match="unknown reward 'mylib.reward'.*--allow_reward_imports"):
        resolve_reward_funcs(["mylib.reward"], allow_imports=False)
    with pytest.raises(ValueError, match="reward_funcs is empty"):
        resolve_reward_funcs([], allow_imports=False)
    assert resolve_reward_funcs(["trl_groupx.toy.arithmetic_reward"], allow_imports=True)


def test_headroom_probe_settings_are_checked(tmp_path):
    script_args, training_args, model_args = make_parser().parse_args_and_config(
        ["--config", str(RECIPES[0].parent / "webagent_headroom.yaml"), "--toy", "--output_dir", str(tmp_path),
         *CPU_OVERRIDES, "--headroom_probe_samples", "0"]
    )
    with pytest.raises(ValueError, match="headroom_probe_samples >= 1"):
        build_trainer(script_args, training_args, model_args)
