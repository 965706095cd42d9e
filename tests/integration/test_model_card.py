"""`trainer.save_model()`, checkpoints and `push_to_hub()` write trl_groupx's model card (`ModelCardMixin` in
`trl_groupx.GRPOTrainer`), where TRL's trainer writes none on `save_model()`."""

import trl

from tests.conftest import build_trainer
from trl_groupx import GRPOConfig, GRPOTrainer, get_variant
from trl_groupx.model_card import ModelCardMixin


def _with_card_hook(trainer):
    assert isinstance(trainer, ModelCardMixin)  # part of trl_groupx.GRPOTrainer
    return trainer


def test_save_model_writes_card_with_flags_and_bibtex(tmp_path):
    trainer = _with_card_hook(build_trainer(GRPOTrainer, GRPOConfig, tmp_path / "run", loss_type="grpo",
                                            scale_rewards="group", beta=0.04, advantage_estimator="sign_adv"))
    trainer.recipe_path = None
    out = tmp_path / "saved"
    trainer.save_model(str(out))
    card = (out / "README.md").read_text()
    assert (out / "model.safetensors").exists() or any(out.glob("*.safetensors"))
    assert "| advantages | `sign_adv`" in card and "`advantage_estimator='sign_adv'`" in card
    assert "`grpo_deepseekmath` (TRL built-in)" in card
    assert get_variant("grpo_deepseekmath").bibtex.strip() in card
    assert "- `sign_adv`: " + get_variant("sign_adv").paper in card
    assert "reward functions: `parity_reward`" in card
    assert "None: this run was configured in code" in card

    # TRL's own create_model_card (push_to_hub, checkpoints) now writes ours too, into args.output_dir
    trainer.create_model_card(model_name="my-model")
    card = (tmp_path / "run" / "README.md").read_text()
    assert "# my-model" in card and "`sign_adv`" in card


def test_trl_alone_writes_no_card_on_save_model(tmp_path):
    """Why the mixin also covers save_model: TRL 1.16 writes a card only on checkpoints and push_to_hub."""
    trainer = build_trainer(trl.GRPOTrainer, trl.GRPOConfig, tmp_path / "run")
    trainer.save_model(str(tmp_path / "saved"))
    assert not (tmp_path / "saved" / "README.md").exists()


def test_push_to_hub_uploads_our_card_to_a_standin_hub(tmp_path, monkeypatch):
    """`push_to_hub()` against tests/unit/hub_standin.py: a local STAND-IN HTTP server speaking the subset of the
    Hub API that huggingface_hub uses (create_repo, validate-yaml, preupload, commit). It is not the Hub."""
    import huggingface_hub.constants

    from tests.unit.hub_standin import HubStandIn

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with HubStandIn() as hub:
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub.url)  # nothing may leave for the real Hub
        monkeypatch.setattr(huggingface_hub.constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                            hub.url + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        # transformers keeps one HfApi (endpoint fixed when first built, e.g. by an earlier test's model loading):
        # drop it for this test, so that push_to_hub builds one on the stand-in's endpoint
        monkeypatch.setattr("transformers.utils.hub._hf_api", None)
        trainer = _with_card_hook(build_trainer(GRPOTrainer, GRPOConfig, tmp_path / "run", loss_type="gmpo",
                                                hub_model_id="alice/tiny-gmpo", hub_token="hf_standin"))
        trainer.push_to_hub(blocking=True)
        files = hub.repos[("model", "alice/tiny-gmpo")]
        card = files["README.md"].decode()
        assert "# tiny-gmpo" in card and "`loss_type='gmpo'`" in card and "- gmpo\n" in card
        assert hub.validated_cards and hub.validated_cards[-1] == card  # front matter parsed as YAML by the stand-in
        assert any(name.endswith(".safetensors") for name in files)
        assert not hub.unknown
