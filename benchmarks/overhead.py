"""Median step-time ratio of every registered trl_groupx variant against plain TRL, interleaved in one process.

    python benchmarks/overhead.py --steps 20                    # every variant, writes results/overhead.{md,json}
    python benchmarks/overhead.py --steps 5 --cases "no flag" gmpo
    python benchmarks/overhead.py --steps 15 --missing --output-dir benchmarks/results   # add new variants' rows
    python benchmarks/overhead.py --steps 15 --cases gagpo --output-dir benchmarks/results   # redo one row

The cases come from the registry, so a new variant joins without an edit here. Each case runs the variant's own flags
(the paper's defaults) in `trl_groupx.GRPOTrainer` against `trl.GRPOTrainer` with the same TRL-level settings (group
size, beta, clipping; a trl_groupx loss type is compared with TRL's `grpo`), on the same batches: the two trainers'
steps alternate, so drift in machine load hits both equally, and the median of the per-step ratios is reported.

"no flag" adds nothing to the math and should sit at 1.00 within noise. TRL's own presets (`native` variants: DAPO,
Dr. GRPO, GSPO, CISPO, SAPO, GRPO, GDPO) run TRL's code path; their row measures only the dispatch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

for _key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "TRL_EXPERIMENTAL_SILENCE"):
    os.environ.setdefault(_key, "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import trl  # noqa: E402

import trl_groupx  # noqa: E402
from tests.conftest import build_trainer, parity_reward  # noqa: E402
from trl_groupx.config import TRL_LOSS_TYPES  # noqa: E402
from trl_groupx.sampling.prompt_sampler import selection_for  # noqa: E402

TRL_FIELDS = {f.name for f in dataclasses.fields(trl.GRPOConfig)}


def length_reward(completions, **kwargs) -> list[float]:
    """A second reward function for the multi-reward variants: 1 for completions of at most 3 characters."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [float(len(t) <= 3) for t in texts]


# Documented modes of one variant timed as cases of their own, "id:mode" → flags added to the variant's registry flags.
MODE_CASES = {"spo_segment:tree": {"spo_segment_mode": "tree"}}
MODE_WORK = {"spo_segment:tree": "per-token weights; one no-grad forward for rollout log-probs/entropies; each group "
                                 "grown as a tree in the batch's generation: TRL's call on the depth-0 spines, then "
                                 "one generate call per depth for the rows below, continued from their shared "
                                 "prefixes"}


def variant_id(name: str) -> str:
    """The registry id of a case (`"id:mode"` → `"id"`)."""
    return name.split(":")[0]


def registry_cases() -> dict[str, dict]:
    """Case name → trl_groupx.GRPOConfig flags: "no flag", then every registered variant with its registry flags,
    then the modes of `MODE_CASES`."""
    cases = {"no flag": {}, **{v.id: dict(v.flags) for v in trl_groupx.list_variants()}}
    cases.update({name: {**cases[variant_id(name)], **flags} for name, flags in MODE_CASES.items()})
    return cases


def trl_flags(flags: dict) -> dict:
    """The TRL-level part of a variant's flags, for the plain-TRL trainer it is timed against."""
    out = {k: v for k, v in flags.items() if k in TRL_FIELDS}
    if out.get("loss_type", "grpo") not in TRL_LOSS_TYPES:
        out["loss_type"] = "grpo"
    if out.get("num_generations") == 1:  # sppo's one rollout per prompt: TRL's minimum group, as many rollouts
        out["num_generations"] = 2
    if out.get("importance_sampling_level") == "turn":  # a trl_groupx ratio level (gagpo's flags): TRL's is per token
        out["importance_sampling_level"] = "token"
    return out


def batch_flags(flags: dict) -> dict:
    """At least two groups per step and at least 8 rollouts; a paper's generation batch is scaled down to one step."""
    per_device = max(8, 2 * flags.get("num_generations", 4))
    sizes = {"per_device_train_batch_size": per_device}
    if "generation_batch_size" in flags:
        sizes["generation_batch_size"] = per_device
    return sizes


def timed_step(trainer, step: int) -> float:
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    torch.manual_seed(step)
    batch = next(iter(trainer.get_train_dataloader()))
    start = time.perf_counter()
    inputs = trainer._prepare_inputs(batch)
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    trainer.model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def measure(name: str, flags: dict, steps: int, tmp: Path) -> dict:
    requires = set() if name == "no flag" else set(trl_groupx.get_variant(variant_id(name)).requires)
    # a second reward function only where the variant reads the per-function rewards (others expect [0, 1] rewards)
    rewards = [parity_reward, length_reward] if "rewards_per_func" in requires else [parity_reward]
    # the base model under the adapter is the reference (no second model)
    peft = bool({"ref_logps", "reference_sample_rewards"} & requires)
    sizes = batch_flags(flags)
    # the toy dataset's reference column (ours only: TRL has no such field)
    column = {"gcpo_ref_column": "answer"} if "gcpo_ref_column" in flags else {}
    if flags.get("edge_grpo_gec"):  # EDGE-GRPO's guided correction: the toy's only reference column, for both
        column.update(edge_grpo_gec_answer_column="answer", edge_grpo_gec_solution_column="answer")
    if "sage_column" in flags:  # SAGE: the toy dataset's reference column
        column["sage_column"] = "answer"
    if "lspo_column" in flags:  # LSPO: the toy dataset's reference column (the scaffold's SFT target)
        column["lspo_column"] = "answer"
    if "answer_belief" in requires:  # GRPO-VPS: the toy dataset's reference answers
        column["belief_probe_answer_column"] = "answer"
    if "teacher_logps" in requires:  # dGRPO's teacher: the tiny model itself (the student's tokenizer)
        from trl_groupx.toy import tiny_model_path

        column["opd_teacher_model"] = tiny_model_path()
    if "dpo_logps" in requires:  # RTO's DPO model: the tiny model itself (token rewards 0, the cost is the forward)
        from trl_groupx.toy import tiny_model_path

        column["rto_dpo_model"] = tiny_model_path()
    if "prompt_value_logits" in requires:  # SPPO's value model: the tiny model with a new scalar head
        from trl_groupx.toy import tiny_model_path

        column["sppo_value_model"] = tiny_model_path()
    if flags.get("rollout_filter") == "s2l_po":  # S2L-PO's explorer: the tiny model itself (the cost is its generation)
        from trl_groupx.toy import tiny_model_path

        column["s2l_po_explorer_model"] = tiny_model_path()
    if "step_modules" in requires:  # LM calls grouped by module: both trainers run the shipped two-module program
        from trl_groupx.toy.two_module_program import make_two_module_program_rollout

        sizes.update(rollout_func=make_two_module_program_rollout(), max_completion_length=16)
    elif "step_structure" in requires:  # multi-turn step credit: both trainers play the shipped counter game
        from trl_groupx.toy.counter_rollout import make_counter_game_rollout

        sizes.update(rollout_func=make_counter_game_rollout(), max_completion_length=64)
    if "counterfactual_rewards" in requires:  # CCPO: both trainers run the shipped Thinker → Solver team
        from trl_groupx.toy.two_agent_rollout import make_two_agent_rollout

        sizes.update(rollout_func=make_two_agent_rollout(), max_completion_length=16)
    if "rc_grpo_prompt_condition_tokens" in flags:  # RC-GRPO: both trainers on the tiny model with the reward tokens
        from trl_groupx.sampling.rctp import save_with_condition_tokens
        from trl_groupx.toy import load_tiny_tokenizer, tiny_model_path

        tokenizer = load_tiny_tokenizer()
        sizes.update(model=save_with_condition_tokens(tiny_model_path(), tokenizer, tmp / f"{name}-model"),
                     processing_class=tokenizer)
    if "consistency_grpo_column" in flags:  # paraphrase groups: the toy problems' phrasings (TRL ignores the column)
        from trl_groupx.toy import arithmetic_dataset
        from trl_groupx.toy.paraphrases import add_arithmetic_paraphrases

        group = flags.get("num_generations", 4)
        sizes["dataset"] = add_arithmetic_paraphrases(arithmetic_dataset(64, seed=0)).map(
            lambda row: {"paraphrases": row["paraphrases"][:group]})
    theirs = build_trainer(trl.GRPOTrainer, trl.GRPOConfig, tmp / f"{name}-trl", reward_funcs=rewards, peft=peft,
                           **{**trl_flags(flags), **sizes})
    ours = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp / f"{name}-ours", reward_funcs=rewards,
                         peft=peft, **{**flags, **sizes, **column})
    timed_step(theirs, -1), timed_step(ours, -1)  # warm-up, not counted
    ratios = [timed_step(ours, step) / timed_step(theirs, step) for step in range(steps)]
    return {"median_ratio": statistics.median(ratios), "steps": steps, "flags": flags, "lora": peft}


#: Requirement → the extra work the trainer does to fill it (the overhead's usual source).
EXTRA_WORK = {
    "ref_logps": "reference log-probs",
    "greedy_baseline_rewards": "one greedy completion per group, generated and scored",
    "reference_sample_rewards": "one reference-model completion per rollout, generated and scored",
    "contrast_logps": "one no-grad forward under the negative prompt",
    "intra_group_token_divergence": "one no-grad full-distribution forward per group",
    "prompt_kl": "one no-grad forward over each prompt's stored response",
    "teacher_logps": "one no-grad teacher forward per generation batch",
    "step_structure": "timed on the counter game (multi-turn rollouts)",
    "step_modules": "timed on the two-module toy program (LM calls grouped by module)",
    "tempered_logps": "one no-grad full-logits forward (log-probs at the tempered temperatures)",
    "dpo_logps": "one no-grad DPO-model forward per generation batch",
    "prompt_value_logits": "a value-model forward on the prompts and its BCE step (forward + backward) per batch",
    "answer_belief": "up to K + 1 short no-grad teacher-forced forwards per completion (prompt + prefix + answer)",
    "counterfactual_rewards": "timed on the two-agent toy team; its Solver-only completions decoded and scored",
    "judge_scores": "the judge on the rows of all-negative groups only",
    "pair_similarity": "the scorer on every pair of each group (here the built-in token Jaccard)",
    "segment_mc_values": "K continuations per cut point (official K = 9), generated and scored (Monte-Carlo values)",
    "prm_step_scores": "the step PRM on the rows of all-equal groups only",
    "self_teacher_topk": "a self-teacher forward over each routed failed rollout re-prompted with a correct sibling "
                         "(top-k kept); the student's top-k log-probs in the loss forward",
}
#: Sampling variants whose extra work is not a requirement: what they add instead of a keep-mask.
SAMPLING_WORK = {
    "n_grpo": "an embedding-mixing hook at generation; every log-prob forward replays the mixed inputs",
    "repo": "a replay buffer; from a prompt's 16th buffered rollout on, k stored rollouts appended to its group "
            "(here from the 5th step: every timed step re-serves the same first batch, 4 rollouts per prompt each)",
    "s2l_po": "the explorer generates the batches of the official schedule's explorer steps (here the tiny model "
              "itself, so the cost is the model swap)",
    "pilot_commit": "pilot rollouts per candidate prompt, generated and scored, before the committed batch; the "
                    "committed groups' first rows are the stored pilot rollouts (not generated again)",
    "sgpo": "one profiling pass over the dataset at the first step (S completions per prompt, scored); groups of "
            "ceil(1/p) rollouts, advantages group by group",
    "ebpo_curriculum": "one profiling pass over the dataset at the first step (16 completions per prompt, scored)",
    "soup": "from a prompt's second visit (here every step after the first: each timed step re-serves the same "
            "batch), the mixed rows generated from prompt + stored prefix in TRL's own call, and a full-batch "
            "log-prob forward for their behaviour log-probs; the stored slots' log-probs every batch",
    "eframe": "for all-fail groups: n extra rollouts at T = 1.2, scored, the |A| > 1 ones appended; a |A| filter; "
              "a replay buffer re-inserted every 5 batches",
    "logit_avg": "a reference forward at every decoding step and in every log-prob forward (mixed logits)",
    "lspo": "for all-fail groups: a LoRA scaffold (added, SFT-fitted on their solutions, deleted), one scaffold "
            "re-roll per slot, scored, scaffold and policy log-probs of the spliced rows (under the toy's parity "
            "reward few groups fail entirely: the median mostly times steps without a scaffold)",
}


def what_it_adds(name: str) -> str:
    if name == "no flag":
        return "nothing (TRL's path)"
    if name in MODE_WORK:
        return MODE_WORK[name]
    variant = trl_groupx.get_variant(name)
    if variant.native:
        return "nothing (TRL's own preset)"
    parts = {"sampling": "a keep-mask over the rollouts", "advantages": "an advantage function on the global batch",
             "token_weights": "per-token weights", "objective": "its surrogate in place of TRL's loss"}
    extra = [parts[variant.stage]]
    if selection_for(name) is not None:  # prompt selection: chooses the prompts, keeps every rollout
        extra = ["a prompt choice before generation"]
        if "v0_value_predictor" in variant.params:
            extra.append("the value predictor scores every candidate prompt (built-in kNN over the run's history)")
    elif "gcpo_ref_column" in variant.params:
        extra = ["a reference completion re-scored for all-fail groups"]
    elif "consistency_grpo_column" in variant.params:
        extra = ["each rollout's prompt replaced by one of its row's paraphrases"]
    elif "igrpo_num_drafts" in variant.params:
        extra = ["a first generation round (k drafts per prompt, default k = G), scored, before the trained one"]
    elif "sage_column" in variant.params:
        extra = ["for unsolved groups: one greedy hint each and up to 3 re-generations of the batch, scored"]
    if name in SAMPLING_WORK:
        extra = [*extra, SAMPLING_WORK[name]] if selection_for(name) is not None else [SAMPLING_WORK[name]]
    elif "rc_grpo_prompt_condition_tokens" in variant.params:
        extra = ["a reward token in each training prompt (one token longer); sampled reward tokens masked out"]
    one_forward = {"entropies", "old_logps"} & set(variant.requires) and "tempered_logps" not in variant.requires
    if one_forward and variant.stage == "token_weights":
        extra.append("one no-grad forward for rollout log-probs/entropies")
    extra += [what for need, what in EXTRA_WORK.items() if need in variant.requires]
    if variant.flags.get("edge_grpo_gec"):
        extra.append("guided error correction: failed rollouts' completions rewritten, re-scored, log-probs redone")
    if variant.flags.get("hapo_adaptive_temperature"):
        extra.append("a per-token temperature at every decoding step (one softmax entropy per step)")
    if variant.flags.get("importance_sampling_level") == "turn":
        extra.append("one ratio per assistant turn")
    if "step_modules" in variant.requires:  # timed on the two-module program, not on the counter game
        extra.remove(EXTRA_WORK["step_structure"])
    if "counterfactual_rewards" in variant.requires:  # timed on the two-agent team, not on the two-module program
        extra.remove(EXTRA_WORK["step_modules"])
    return "; ".join(extra)


def table_footer(path: Path) -> list[str]:
    """The hand-written notes below an existing report's table (kept when rows are added)."""
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    last_row = max(i for i, line in enumerate(lines) if line.startswith("|"))
    return lines[last_row + 1:]


def write_report(results: dict, out: Path, steps: int) -> None:
    footer = table_footer(out / "overhead.md")
    lines = ["# Step-time overhead against plain TRL\n",
             f"`python benchmarks/overhead.py --steps {steps}`: median over {steps} interleaved steps of "
             "(trl_groupx step time / trl.GRPOTrainer step time) on the same batches, tiny model, CPU, 1 thread. "
             "Each variant runs its registry flags; TRL runs the same TRL-level settings.\n",
             "| case | median ratio | what it adds |", "|---|---|---|"]
    for name, r in results.items():
        cell = f"{r['median_ratio']:.3f}" if "median_ratio" in r else f"skipped: {r['skipped']}"
        lines.append(f"| {name} | {cell} | {what_it_adds(name)} |")
    (out / "overhead.md").write_text("\n".join(lines + footer) + "\n")
    (out / "overhead.json").write_text(json.dumps(results, indent=1, default=str))


def main(argv: list[str] | None = None) -> dict:
    cases = registry_cases()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--cases", nargs="*", default=list(cases), help="case names (default: all)")
    parser.add_argument("--output-dir", default=None,
                        help="write overhead.md/.json here, keeping the rows of cases not run now (default: print only)")
    parser.add_argument("--missing", action="store_true",
                        help="only the cases absent from --output-dir's overhead.json")
    ns = parser.parse_args(argv)
    previous: dict[str, dict] = {}
    if ns.missing and not ns.output_dir:
        parser.error("--missing needs --output-dir (the report to complete)")
    if ns.output_dir and (Path(ns.output_dir) / "overhead.json").exists():  # rows run now replace their old ones
        previous = json.loads((Path(ns.output_dir) / "overhead.json").read_text())
    if ns.missing:
        ns.cases = [c for c in ns.cases if c not in previous]
    unknown = [c for c in ns.cases if c not in cases]
    if unknown:
        parser.error(f"unknown cases {unknown}; choose from {list(cases)}")
    tmp = Path(tempfile.mkdtemp())
    results: dict[str, dict] = {}
    print(f"{'case':<24} {'median ratio vs TRL':>20}")
    for name in ns.cases:
        try:
            results[name] = measure(name, cases[name], ns.steps, tmp)
            print(f"{name:<24} {results[name]['median_ratio']:>20.3f}", flush=True)
        except (ValueError, NotImplementedError) as err:  # a variant whose config needs a component we lack
            results[name] = {"skipped": str(err).split("\n")[0][:160], "flags": cases[name]}
            print(f"{name:<24} {'skipped':>20}  {results[name]['skipped']}", flush=True)
    if ns.output_dir:
        out = Path(ns.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        merged = {name: {**previous, **results}[name] for name in cases if name in {**previous, **results}}
        write_report(merged, out, ns.steps)
    return results


if __name__ == "__main__":
    main()
