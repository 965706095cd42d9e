"""Model cards that say how a model was trained: the variant flags that were on, the recipe, and BibTeX for every
paper whose flag was on (template: `model_cards/template.md`).

`render_model_card(args, ...)` turns a `trl_groupx.GRPOConfig` (or a plain `trl.GRPOConfig`) into the card's text.
`ModelCardMixin` is the trainer hook: put it before `trl.GRPOTrainer` in the trainer's bases and

- `create_model_card()` (called by TRL from `push_to_hub()` and from every checkpoint save) writes this card instead of
  TRL's generic one, into `args.output_dir`;
- `save_model(output_dir)` also writes it, into `output_dir` (TRL 1.16 writes no card in `save_model`).

A variant counts as *on* when it is dispatched (its stage's selector is set to its id, `GRPOConfig.active_variants`),
or, for a variant TRL implements natively (`native=True`, e.g. `dapo`, `dr_grpo`, `gspo`), when every one of its
registered flags holds in the config: string, boolean and `None` flags must be equal, numeric flags (clip ranges,
`beta`) must be set (their value may differ from the paper's; the card then shows both). BibTeX comes from the
registry's `Variant.bibtex`; where a variant has none, the card names its `paper` string instead (nothing is
invented). The GRPO paper (TRL's `GRPOTrainer._paper`) and TRL itself are always cited.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from .registry import Variant, list_variants

TEMPLATE_PATH = Path(__file__).resolve().parents[1] / "model_cards" / "template.md"
MAX_RECIPE_IN_CARD = 1_000_000
# Used when the package is installed without the repository's model_cards/ folder.
_FALLBACK_TEMPLATE = """---
library_name: transformers
tags:
- trl
- trl-groupx
- grpo
{tags}
{base_model_yaml}
---

# {model_name}

Fine-tuned from {base_model} with GRPO using trl_groupx {groupx_version} on top of TRL {trl_version}.

## Variant flags

{flags_table}

## Training

{training}

## Recipe

{recipe}

## Citations

Papers whose variant flag was on:

{bibtex}

GRPO and TRL:

{base_bibtex}
"""
_SECRET_LINE = re.compile(r"^(\s*(?:[\w.-]*_)?(?:token|secret|password|api_key)\s*:\s*)\S.*$", re.MULTILINE | re.IGNORECASE)
# GRPO settings worth a line in the card's Training section, whichever variants are on.
_TRAINING_FIELDS = ("loss_type", "scale_rewards", "num_generations", "learning_rate", "beta", "epsilon", "epsilon_high",
                    "temperature", "max_completion_length", "num_iterations")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _native_is_on(args: Any, variant: Variant) -> bool:
    for key, paper_value in variant.flags.items():
        if not hasattr(args, key):
            return False
        value = getattr(args, key)
        if _is_number(paper_value):
            if not _is_number(value):
                return False
        elif value != paper_value:
            return False
    return True


def active_variants(args: Any) -> list[Variant]:
    """The variants that were on in `args`: dispatched ones, then native ones whose flags hold (module docstring)."""
    dispatched = set(args.active_variants().values()) if hasattr(args, "active_variants") else set()
    return [v for v in list_variants() if (v.id in dispatched if not v.native else _native_is_on(args, v))]


def variant_settings(args: Any, variant: Variant) -> list[str]:
    """`name=value` for the variant's flags and hyper-parameters as set in `args` (paper value noted where it
    differs, for native variants)."""
    items = []
    for key in [*variant.flags, *[p for p in variant.params if p not in variant.flags]]:
        value = getattr(args, key, None)
        text = f"{key}={value!r}"
        if key in variant.flags and variant.flags[key] != value:
            text += f" (paper: {variant.flags[key]!r})"
        items.append(text)
    return items


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def flags_table(args: Any, variants: list[Variant]) -> str:
    if not variants:
        return (f"None: plain GRPO as TRL implements it (`loss_type={getattr(args, 'loss_type', None)!r}`, "
                f"`scale_rewards={getattr(args, 'scale_rewards', None)!r}`).")
    rows = ["| stage | variant | flags | paper |", "| --- | --- | --- | --- |"]
    for v in variants:
        flags = ", ".join(f"`{item}`" for item in variant_settings(args, v))
        origin = " (TRL built-in)" if v.native else ""
        rows.append(f"| {v.stage} | `{v.id}`{origin}: {_cell(v.name)} | {_cell(flags)} | {_cell(v.paper)} |")
    return "\n".join(rows)


def bibtex_section(variants: list[Variant]) -> str:
    entries = [v.bibtex.strip() for v in variants if v.bibtex and v.bibtex.strip()]
    missing = [v for v in variants if not (v.bibtex and v.bibtex.strip())]
    parts = []
    if entries:
        parts.append("```bibtex\n" + "\n\n".join(dict.fromkeys(entries)) + "\n```")
    if missing:
        parts.append("No BibTeX entry registered; cite from the paper:\n\n" + "\n".join(
            f"- `{v.id}`: {v.paper}" + (f" (official code: {v.official_code})" if v.official_code else "")
            for v in missing))
    return "\n\n".join(parts) if parts else "None (no trl_groupx variant was on)."


def _trl_citation() -> str | None:
    import trl

    template = Path(trl.__file__).parent / "templates" / "lm_model_card.md"
    try:
        match = re.search(r"\{% raw %\}(@software\{.*?\n\})\{% endraw %\}", template.read_text(), re.DOTALL)
    except OSError:
        return None
    return match.group(1) if match else None


def base_bibtex(variants: list[Variant]) -> str:
    import trl

    entries = []
    grpo = getattr(trl.GRPOTrainer, "_paper", {}).get("citation")
    already = " ".join(v.bibtex or "" for v in variants)
    if grpo and "shao2024deepseekmath" not in already:
        entries.append(grpo.strip())
    trl_cite = _trl_citation()
    if trl_cite:
        entries.append(trl_cite.strip())
    return "```bibtex\n" + "\n\n".join(entries) + "\n```" if entries else "-"


def recipe_section(recipe: str | os.PathLike | None) -> str:
    if not recipe:
        return "None: this run was configured in code, not from a recipe file."
    path = Path(recipe)
    text = None
    if path.is_file() and path.stat().st_size <= MAX_RECIPE_IN_CARD:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            text = None
    if text is not None:  # a card is public: never copy a credential from the recipe into it
        text = _SECRET_LINE.sub(r"\1<redacted>", text)
    head = f"Trained with `trl-groupx grpo --config {path.name}`"
    if text is None:
        return head + f" (recipe file `{recipe}`)."
    return head + ":\n\n```yaml\n" + text.rstrip("\n").replace("```", "` ` `") + "\n```"


def training_section(args: Any, *, dataset_name: str | None = None, reward_funcs: list[str] | None = None,
                     peft: bool | None = None) -> str:
    lines = []
    if dataset_name:
        lines.append(f"- dataset: `{dataset_name}`")
    if reward_funcs:
        lines.append("- reward functions: " + ", ".join(f"`{r}`" for r in reward_funcs))
    if peft is not None:
        lines.append(f"- adapter: {'LoRA (PEFT)' if peft else 'none (full fine-tuning)'}")
    settings = [f"`{key}={getattr(args, key)!r}`" for key in _TRAINING_FIELDS if hasattr(args, key)]
    lines.append("- GRPO settings: " + ", ".join(settings))
    return "\n".join(lines)


def _template_text(template: str | os.PathLike | None) -> str:
    path = Path(template) if template is not None else TEMPLATE_PATH
    if path.is_file():
        return path.read_text(encoding="utf-8")
    if template is not None:
        raise FileNotFoundError(f"model card template {path} not found.")
    return _FALLBACK_TEMPLATE


def render_model_card(
    args: Any,
    *,
    recipe: str | os.PathLike | None = None,
    model_name: str | None = None,
    base_model: str | None = None,
    dataset_name: str | None = None,
    reward_funcs: list[str] | None = None,
    peft: bool | None = None,
    tags: list[str] | str | None = None,
    template: str | os.PathLike | None = None,
) -> str:
    """The model card for a run configured by `args` (a `trl_groupx.GRPOConfig`).

    `recipe` defaults to `args.recipe` / `args.recipe_path` when the config carries one; without a recipe the card
    says so. `model_name` defaults to the last part of `hub_model_id`, else the name of `output_dir`.
    """
    import trl

    from . import __version__

    recipe = recipe or getattr(args, "recipe", None) or getattr(args, "recipe_path", None)
    if model_name is None:
        hub_id = getattr(args, "hub_model_id", None)
        model_name = hub_id.split("/")[-1] if hub_id else Path(getattr(args, "output_dir", None) or "model").name
    variants = active_variants(args)
    extra_tags = [tags] if isinstance(tags, str) else list(tags or [])
    extra_tags += [v.id for v in variants]
    extra_tags = [t for t in dict.fromkeys(extra_tags) if t not in ("trl", "trl-groupx", "grpo")]
    values = {
        "tags": "\n".join(f"- {t}" for t in extra_tags),
        "base_model_yaml": f"base_model: {base_model}" if base_model else "",
        "base_model": f"[{base_model}](https://huggingface.co/{base_model})" if base_model else "a local model",
        "model_name": model_name,
        "groupx_version": __version__,
        "trl_version": trl.__version__,
        "flags_table": flags_table(args, variants),
        "training": training_section(args, dataset_name=dataset_name, reward_funcs=reward_funcs, peft=peft),
        "recipe": recipe_section(recipe),
        "bibtex": bibtex_section(variants),
        "base_bibtex": base_bibtex(variants),
    }
    text = _template_text(template)
    # one pass over the template's own placeholders: braces inside the values (BibTeX, YAML) are left alone
    text = re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), m.group(0)), text)
    return _tidy_front_matter(text)


def _tidy_front_matter(text: str) -> str:
    """Drop the blank lines left in the YAML front matter by empty placeholders."""
    if not text.startswith("---\n"):
        return text
    end = text.find("\n---", 4)
    if end < 0:
        return text
    front = "\n".join(line for line in text[4:end].splitlines() if line.strip())
    return "---\n" + front + text[end:]


def write_model_card(trainer: Any, output_dir: str | os.PathLike | None = None, *, model_name: str | None = None,
                     dataset_name: str | None = None, tags: list[str] | str | None = None) -> Path:
    """Render the card for `trainer` and write it to `<output_dir or args.output_dir>/README.md`."""
    from accelerate.utils import is_peft_model
    from trl.trainer.utils import get_config_model_id

    base_model = get_config_model_id(trainer.model.config)
    if base_model and os.path.isdir(base_model):  # a local folder is not a Hub id (as TRL does)
        base_model = None
    card = render_model_card(
        trainer.args,
        recipe=getattr(trainer, "recipe_path", None),
        model_name=model_name,
        base_model=base_model,
        dataset_name=dataset_name,
        reward_funcs=list(getattr(trainer, "reward_func_names", []) or []),
        peft=is_peft_model(trainer.model),
        tags=tags,
    )
    out = Path(output_dir if output_dir is not None else trainer.args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "README.md"
    path.write_text(card, encoding="utf-8")
    return path


class ModelCardMixin:
    """Trainer hook: `class GRPOTrainer(ModelCardMixin, trl.GRPOTrainer)` makes `save_model()`, checkpoints and
    `push_to_hub()` write trl_groupx's card (`render_model_card`) instead of TRL's."""

    def create_model_card(self, model_name=None, dataset_name=None, tags=None, **kwargs) -> None:
        # push_to_hub() passes model_name and its own kwargs (language, license, ...), which this card does not use
        if not self.is_world_process_zero():
            return
        write_model_card(self, self.args.output_dir, model_name=model_name, dataset_name=dataset_name, tags=tags)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        super().save_model(output_dir, _internal_call)
        if self.args.should_save and self.is_world_process_zero():
            write_model_card(self, output_dir)
