"""Model cards (trl_groupx/model_card.py): active variant flags, the recipe, and BibTeX of every paper whose flag was on."""

from pathlib import Path

import pytest

from trl_groupx import GRPOConfig, get_variant
from trl_groupx.model_card import TEMPLATE_PATH, active_variants, render_model_card

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def _config(tmp_path, **kwargs):
    return GRPOConfig(output_dir=str(tmp_path / "qwen-run"), use_cpu=True, bf16=False, report_to="none", **kwargs)


def test_template_is_the_repository_one():
    assert TEMPLATE_PATH.is_file() and "{flags_table}" in TEMPLATE_PATH.read_text()


def test_card_names_flags_recipe_and_bibtex(tmp_path):
    args = _config(tmp_path, loss_type="gmpo", gmpo_clip=0.3, loss_aggregation="sequence_mean",
                   scale_rewards="group", beta=0.04)
    card = render_model_card(args, recipe=RECIPES / "gmpo.yaml", base_model="Qwen/Qwen2.5-Math-1.5B",
                             reward_funcs=["accuracy_reward"], peft=True)
    assert card.startswith("---\nlibrary_name: transformers\n")
    front = card.split("\n---\n", 1)[0]
    assert "- gmpo" in front and "base_model: Qwen/Qwen2.5-Math-1.5B" in front and "\n\n" not in front
    assert "# qwen-run" in card
    assert "`gmpo`: GMPO (Geometric-Mean Policy Optimization)" in card
    assert "`loss_type='gmpo'`, `gmpo_clip=0.3 (paper: 0.4)`" in card
    assert "`trl-groupx grpo --config gmpo.yaml`" in card and "gmpo_clip: 0.4                 # official script" in card
    assert "reward functions: `accuracy_reward`" in card and "LoRA (PEFT)" in card
    # gmpo has no BibTeX in the registry: its paper string stands in
    assert get_variant("gmpo").bibtex is None
    assert "- `gmpo`: Geometric-Mean Policy Optimization, arXiv:2507.20673" in card
    # loss_type='grpo' is not on, so the GRPO paper appears once, among the base citations, and TRL is cited
    assert card.count("@article{shao2024deepseekmath") == 1 and "@software{vonwerra2020trl" in card
    assert "{" + "flags_table}" not in card and "{" + "bibtex}" not in card  # every placeholder filled


def test_registered_bibtex_is_used_for_native_variants(tmp_path):
    # grpo_deepseekmath is TRL-native: its flags are loss_type='grpo', scale_rewards='group', beta (set)
    args = _config(tmp_path, loss_type="grpo", scale_rewards="group", beta=0.04)
    assert [v.id for v in active_variants(args)] == ["grpo_deepseekmath"]
    card = render_model_card(args)
    bib = get_variant("grpo_deepseekmath").bibtex.strip()
    assert bib in card.split("Papers whose variant flag was on:")[1].split("GRPO and TRL:")[0]
    assert card.count("shao2024deepseekmath") == 1  # not repeated among the base citations
    assert "`grpo_deepseekmath` (TRL built-in)" in card


def test_native_variant_needs_its_flags(tmp_path):
    # TRL 1.16's default loss_type is 'dapo', but without DAPO's clip-higher and overlong masking it is not DAPO
    assert [v.id for v in active_variants(_config(tmp_path))] == []
    args = _config(tmp_path, loss_type="dapo", epsilon_high=0.3, mask_truncated_completions=True)
    assert [v.id for v in active_variants(args)] == ["dapo"]
    assert "`epsilon_high=0.3 (paper: 0.28)`" in render_model_card(args)


def test_plain_grpo_card_says_none(tmp_path):
    card = render_model_card(_config(tmp_path))
    assert "None: plain GRPO as TRL implements it (`loss_type='dapo'`" in card
    assert "None: this run was configured in code, not from a recipe file." in card
    assert "None (no trl_groupx variant was on)." in card


def test_recipe_from_args_and_secrets_redacted(tmp_path):
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("advantage_estimator: sign_adv\nhub_token: hf_SECRET123\ntokenizer_name: keep/me\n")
    args = _config(tmp_path, advantage_estimator="sign_adv")
    args.recipe = str(recipe)  # a config that carries its recipe path
    card = render_model_card(args)
    assert "`trl-groupx grpo --config mine.yaml`" in card and "hf_SECRET123" not in card and "hub_token: <redacted>" in card
    assert "tokenizer_name: keep/me" in card
    assert "| advantages | `sign_adv`" in card


def test_composition_cites_every_active_paper(tmp_path):
    args = _config(tmp_path, loss_type="gmpo", advantage_estimator="sign_adv")
    card = render_model_card(args, tags=["my-tag"])
    assert [v.id for v in active_variants(args)] == ["sign_adv", "gmpo"]
    for vid in ("sign_adv", "gmpo"):
        assert f"- `{vid}`: {get_variant(vid).paper}" in card
    assert "- my-tag\n- sign_adv\n- gmpo\n" in card


def test_explicit_template_missing_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="template"):
        render_model_card(_config(tmp_path), template=tmp_path / "nope.md")
