"""Sampling-stage fields of `trl_groupx.GRPOConfig`."""

from __future__ import annotations

from dataclasses import dataclass, field

from .consistency_grpo import DEFAULT_COLUMN as CONSISTENCY_GRPO_COLUMN
from .edge_grpo_gec import ANSWER_TEMPLATE as GEC_ANSWER_TEMPLATE
from .edge_grpo_gec import REFLECT_CUE as GEC_REFLECT_CUE
from .igrpo import IGRPO_DRAFT_TEMPLATE
from .rc_grpo import DEFAULT_CONDITION_MIX, DEFAULT_CONDITION_TOKENS
from .sage import SAGE_HINT_INSTRUCTION, SAGE_HINT_REQUEST_TEMPLATE, SAGE_HINT_TEMPLATE


@dataclass
class SamplingArgs:
    """
    rollout_filter (`str` or `None`, *optional*, defaults to `None`):
        Sampling-stage variant that drops rollouts after generation (a registered id), or `None`.
    gfpo_keep (`int`, *optional*, defaults to `8`):
        GFPO: responses kept per group, `k < num_generations` (paper: 8 of 16).
    gfpo_metric (`str`, *optional*, defaults to `"length"`):
        GFPO: `"length"` keeps the k shortest, `"reward_per_token"` the k with the largest reward / length.
    gfpo_adaptive (`bool`, *optional*, defaults to `False`):
        GFPO: Adaptive Difficulty GFPO, k per group from its success rate (fixed bins; see `sampling/gfpo.py`).
    gfpo_adaptive_keep (`str`, *optional*, defaults to `"8,8,6,4"`):
        GFPO adaptive: comma-separated k for group success rate in [0, .25), [.25, .5), [.5, .75), [.75, 1]
        (paper: 8 8 6 4).
    d3s_keep_start (`float`, *optional*, defaults to `0.5`):
        D³S sample level: fraction of each group kept at step 0 (aggressive down-sampling early; our choice).
    d3s_keep_end (`float`, *optional*, defaults to `1.0`):
        D³S sample level: fraction kept at the last step (linear schedule; 1.0 ends at plain GRPO; our choice).
    dapo_max_gen_batches (`int`, *optional*, defaults to `10`):
        DAPO dynamic sampling: most generation batches per training batch (the first included) while refilling
        zero-variance groups; 0 = no cap (verl's `max_num_gen_batches`, DAPO script: 10). When reached, the missing
        groups are zero-variance ones, masked out (verl raises instead).
    gcpo_ref_column (`str`, *optional*, defaults to `"solution"`):
        GCPO (`rollout_filter="gcpo_ref"`): dataset column holding each prompt's reference solution (the "Golden
        Answer"), injected as a completion into groups where every rollout failed.
    gcpo_ref_success_threshold (`float`, *optional*, defaults to `1.0`):
        GCPO: a rollout whose weighted reward is at least this value counts as solved (1.0 for 0/1 accuracy
        rewards); a group with no solved scored rollout gets the reference. Our choice (the paper: "all incorrect").
    gcpo_ref_template (`str`, *optional*, defaults to `"{ref}"`):
        GCPO: the injected completion's text, with `{ref}` replaced by the column's value (plain substitution, so
        LaTeX braces need no escaping), e.g. `"The final answer is $\\boxed{{ref}}$."` when the column holds bare
        answers that the reward function only reads from a box.
    generation_temperatures (`list[float]` or `None`, *optional*, defaults to `None`):
        MDP-GRPO's rollout diversity: completion `j` of every prompt is sampled at `generation_temperatures[j]`
        (length `num_generations`; paper `[0.1, 0.4, 0.7, 1.0]`). Log-probs still use `temperature` for every row
        (official code; set `temperature=1.0`). Transformers generation only. See `trl_groupx/sampling/temperatures.py`.
    generation_micro_group_size (`int` or `None`, *optional*, defaults to `None`):
        Micro sampling groups (Infinite Sampling; an efficiency flag, not a variant): transformers `generate()`
        runs on at most this many sequences at a time, so the generation KV cache and logits scale with it instead
        of the per-device generation batch; completions are reassembled in row order (greedy: identical to one
        call). `None` = TRL's single call. Not with `use_vllm` / `use_transformers_continuous_batching` (they page
        their cache already). See `trl_groupx/sampling/micro_groups.py`.
    vade_success_threshold (`float`, *optional*, defaults to `1.0`):
        VADE (`rollout_filter="vade"`): a rollout whose weighted reward is at least this value is a success of its
        prompt's Beta posterior (1.0 for 0/1 accuracy rewards). See `trl_groupx/sampling/vade.py`.
    vade_decay_slow (`float`, *optional*, defaults to `0.99`):
        VADE: every generation batch, each prompt's posterior keeps this fraction of its evidence beyond the prior
        Beta(1, 1) (slow scale of the two-scale decay; our choice, half-life ≈ 69 batches). In (0, 1].
    vade_decay_fast (`float`, *optional*, defaults to `0.8`):
        VADE: a revisited prompt's evidence is further scaled by this before its new group is added (fast scale;
        our choice). In (0, 1].
    v0_value_predictor (`str`, *optional*, defaults to `"knn"`):
        V₀ (`rollout_filter="v0_value"`): registered name of the value model predicting each candidate prompt's
        success rate from the run's (prompt, success rate) context (`register_value_predictor(name, model)`, e.g. a
        loaded official `V0`); `"knn"` is a built-in toy predictor. See `trl_groupx/sampling/v0_value.py`.
    v0_value_epsilon (`float`, *optional*, defaults to `0.05`):
        V₀: prompts predicted within this of 0 or 1 are skipped (our choice), in [0, 0.5).
    v0_value_context_size (`int`, *optional*, defaults to `256`):
        V₀: most (prompt, observed success rate) pairs kept in the context (256: V₀'s demo).
    v0_value_pool_size (`int`, *optional*, defaults to `0`):
        V₀: candidates scored per generation batch, drawn from the dataset; 0 = the whole dataset.
    v0_value_success_threshold (`float`, *optional*, defaults to `1.0`):
        V₀: a rollout whose weighted reward is at least this value is a success of its prompt.
    pilot_commit_pilot_samples (`int` or `None`, *optional*, defaults to `None`):
        Pilot-Commit (`rollout_filter="pilot_commit"`): pilot rollouts per candidate prompt. `None` = a quarter of
        `num_generations`, at least 2 (the official scripts' split of one group: pilot 32 + commit 96, 16 + 48).
    pilot_commit_reused_pilots (`int` or `None`, *optional*, defaults to `None`):
        Pilot-Commit: pilot rollouts of a committed prompt trained in its group, in place of as many fresh ones
        (official `exploration.n_effective`; `None` = every pilot rollout, the official default; `0` = pilots only
        select). At most `pilot_commit_pilot_samples`, below `num_generations`.
    pilot_commit_pilot_prompts (`int`, *optional*, defaults to `0`):
        Pilot-Commit: candidate prompts piloted per round (0 = the generation batch's prompt count, as officially).
    pilot_commit_band_low (`float`, *optional*, defaults to `0.125`):
        Pilot-Commit: lowest pilot accuracy p̂ of a buffered (later committed) prompt (paper 0.125).
    pilot_commit_band_high (`float`, *optional*, defaults to `0.75`):
        Pilot-Commit: highest pilot accuracy p̂ of a buffered prompt (paper 0.75).
    pilot_commit_exclude_threshold (`float` or `None`, *optional*, defaults to `1.0`):
        Pilot-Commit: prompts with p̂ at or above this are never drawn again (paper 1.0; `None` = exclude nothing).
    pilot_commit_off_steps (`int`, *optional*, defaults to `4`):
        Pilot-Commit: buffered prompts older than this many generation batches are evicted (official 4).
    pilot_commit_selection (`str`, *optional*, defaults to `"random"`):
        Pilot-Commit: which buffered prompts are committed when more wait than fit: `"random"` (official default),
        `"max_variance"` (largest pilot std, then most recent) or `"most_recent"`.
    pilot_commit_max_rounds (`int`, *optional*, defaults to `10`):
        Pilot-Commit: most pilot rounds per generation batch (official 10; 0 = no limit); a batch still short is
        filled with that batch's piloted prompts nearest to the band.
    pilot_commit_success_threshold (`float`, *optional*, defaults to `1.0`):
        Pilot-Commit: a pilot rollout whose weighted reward is at least this value is correct.
    sgpo_profile_samples (`int`, *optional*, defaults to `4`):
        sGPO (`rollout_filter="sgpo"`): completions generated per training prompt in the one profiling pass under
        the initial policy (at the first training generation), giving each prompt's success rate p̂; at least 2.
        4 is our choice (the paper's count was not retrievable). See `trl_groupx/sampling/sgpo.py`.
    sgpo_success_threshold (`float`, *optional*, defaults to `0.5`):
        sGPO: a profiling completion whose weighted reward is above this value is a success (0.5: a 0/1 verifier's 1).
    sgpo_unsolvable_keep (`float`, *optional*, defaults to `0.1`):
        sGPO: fraction of the unsolvable prompts (p̂ = 0) kept, drawn with the run's seed, in [0, 1] (our choice;
        trivial prompts, p̂ = 1, are always removed).
    sgpo_order (`str`, *optional*, defaults to `"easy_to_hard"`):
        sGPO: order of the kept prompts, `"easy_to_hard"` (decreasing p̂, the paper's curriculum), `"hard_to_easy"`
        or `"shuffled"` (filtering only, a seeded permutation).
    sgpo_group_size (`str`, *optional*, defaults to `"inverse_success"`):
        sGPO: `"inverse_success"` gives prompt x a group of `⌈1/p̂_x⌉` rollouts (at least 2, at most
        `sgpo_max_group_size`) within TRL's row budget per generation batch (the paper's rule; GRPO/GDPO advantages
        only); `"fixed"` gives every prompt `num_generations`.
    sgpo_max_group_size (`int` or `None`, *optional*, defaults to `None`):
        sGPO: largest group (that of the never-solved prompts) under `"inverse_success"`; `None` = `num_generations`.
    ebpo_curriculum_mode (`str`, *optional*, defaults to `"difficulty"`):
        EBPO's clustered sampling (`rollout_filter="ebpo_curriculum"`): `"difficulty"` orders the training prompts easy
        → hard by the base model's pass rate (one profiling pass at the first training generation), `"topic"` groups
        them by `ebpo_curriculum_topic_column`. See `trl_groupx/sampling/ebpo_curriculum.py`.
    ebpo_curriculum_samples (`int`, *optional*, defaults to `16`):
        EBPO's clustered sampling: profiling rollouts per prompt for the pass rate (the paper's 16).
    ebpo_curriculum_success_threshold (`float`, *optional*, defaults to `0.5`):
        EBPO's clustered sampling: a profiling rollout with weighted reward above this value is correct.
    ebpo_curriculum_topic_column (`str` or `None`, *optional*, defaults to `None`):
        EBPO's clustered sampling, topic mode: the dataset column with each prompt's topic label.
    soup_mixed_rollouts (`int`, *optional*, defaults to `1`):
        SOUP (`rollout_filter="soup"`): rollouts per group (its last slots) that continue, on-policy, the prefix of
        a rollout sampled for the same prompt at its previous visit; in `[1, num_generations]` (our choice: 1).
    soup_prefix_fraction (`float`, *optional*, defaults to `0.5`):
        SOUP: share of a stored rollout's tokens kept as the off-policy prefix, in `[0, 1)` (our choice: 0.5; 0 is
        plain GRPO). See `trl_groupx/sampling/soup.py`.
    igrpo_num_drafts (`int` or `None`, *optional*, defaults to `None`):
        iGRPO (`rollout_filter="igrpo"`): stage-1 drafts sampled per prompt, the best of which is appended to the
        prompt for the trained stage-2 rollouts; `None` = `num_generations` (our choice; the paper's k is not known
        to us). See `trl_groupx/sampling/igrpo.py`.
    igrpo_draft_template (`str`, *optional*, defaults to a short "previous attempt" note):
        iGRPO: text appended to the prompt (last user message) in stage 2, with `{draft}` replaced by the best draft
        (plain substitution; our choice of wording).
    rc_grpo_prompt_condition_tokens (`list[str]`, *optional*, defaults to `["<|high_reward|>", "<|low_reward|>"]`):
        RC-GRPO (`rollout_filter="rc_grpo"`; the catalog's `prompt_condition_tokens`): reward-goal tokens, one of
        which each training rollout's prompt carries (end of the prompt / last user message). Each must be one
        token of the tokenizer: the policy is the reward-conditioned SFT (RCTP) checkpoint fine-tuned with them
        (`trl_groupx/sampling/rctp.py`). Evaluation prompts carry none. See `trl_groupx/sampling/rc_grpo.py`.
    rc_grpo_condition_mix (`list[float]`, *optional*, defaults to `[0.5, 0.5]`):
        RC-GRPO (the catalog's `condition_mix`): share of each group's rollouts conditioned on each token, in the
        order of `rc_grpo_prompt_condition_tokens`, summing to 1; a group of G gets floor or ceil of G times each
        share (exact for G = 4 and 0.5), assigned by a hash of the seed, step and group.
    consistency_grpo_column (`str`, *optional*, defaults to `"paraphrases"`):
        consistency_grpo (`rollout_filter="consistency_grpo"`; the catalog's `group_key="paraphrase_id"`): dataset
        column holding each row's semantically equivalent prompt variants (a list in the format of `prompt`, at most
        `num_generations`); rollout `j` of a group answers variant `j mod V`, so the group is the paraphrases.
        Evaluation prompts are not rewritten. See `trl_groupx/sampling/consistency_grpo.py`.
    s2l_po_explorer_model (`str` or `None`, *optional*, defaults to `None`):
        S2L-PO (`rollout_filter="s2l_po"`; the catalog's `explorer_model`): model id or local path of the explorer,
        a frozen smaller model of the policy's family with the same tokenizer (paper: Qwen3-1.7B/4B-Base for
        Qwen3-8B-Base), which generates the explorer batches. Required unless `s2l_po_anneal_steps=0`.
    s2l_po_anneal_steps (`int`, *optional*, defaults to `8`):
        S2L-PO (the catalog's `explorer_frac_schedule`): the official N, logical steps of the anneal; logical step t
        has explorer share `1 − (t−1)/(N−1)` and runs an explorer-only generation batch then a learner-only one
        (the first only explorer, the last only learner), after which every batch is the policy's; N = 8 makes
        generation batches 0, 1, 3, 5, 7, 9, 11 explorer batches. 0 = no explorer batch (plain GRPO). See
        `trl_groupx/sampling/s2l_po.py`.
    s2l_po_group_sizes (`str`, *optional*, defaults to `"official"`):
        S2L-PO: `"official"` gives each generation batch the official anneal's rollouts per prompt (explorer 16, 14,
        …, 3; learner 3, …, 16), scaled to `num_generations`, within TRL's row budget (prompts from a seeded
        permutation; GRPO/GDPO advantages only); `"fixed"` keeps TRL's sampler and `num_generations` everywhere.
    sage_column (`str`, *optional*, defaults to `"solution"`):
        SAGE (`rollout_filter="sage"`): dataset column holding each prompt's reference solution, the privileged
        information the policy writes its hints from (never shown to reward functions or at evaluation).
    sage_success_threshold (`float`, *optional*, defaults to `0.0`):
        SAGE: a group is solved when one of its rollouts' weighted reward is strictly above this value (official:
        `reward > 0`); unsolved groups are re-rolled under hint levels 1, 2, 3.
    sage_hint_instruction (`str`, *optional*, defaults to `SAGE_HINT_INSTRUCTION`):
        SAGE: system text of the hint request (three hint levels as a JSON object with keys `level_1..level_3`).
    sage_hint_request_template (`str`, *optional*, defaults to `"Question:\n{question}\n\nSolution:\n{solution}\n"`):
        SAGE: user text of the hint request; `{question}` and `{solution}` are replaced.
    sage_hint_template (`str`, *optional*, defaults to `"\n\nHere is a hint to help you:\n{hint}"`):
        SAGE: appended to a re-rolled group's prompt (its last user message); `{hint}` is replaced by the level's
        hint. See `trl_groupx/sampling/sage.py`.
    sage_method (`str`, *optional*, defaults to `"sage"`):
        SAGE: `"sage"` re-rolls unsolved groups under hints (official default); `"light"` is SAGE-light: each
        prompt's hint level (0-3) moves with its accuracy at its previous visit, one rollout per step.
    sage_light_accuracy_min (`float`, *optional*, defaults to `0.0`):
        SAGE-light: a prompt whose last accuracy is at most this gets the next hint level (official 0).
    sage_light_accuracy_max (`float`, *optional*, defaults to `0.35`):
        SAGE-light: a prompt whose last accuracy is above this gets the previous hint level (official 0.35).
    hapo_adaptive_temperature (`bool`, *optional*, defaults to `False`):
        HAPO's Adaptive Temperature Sampling (part of the `hapo` catalog id; on in its registry flags): each token
        is sampled at `temperature · (1 + τ ĥ)`, `ĥ` its next-token entropy normalised by the previous training
        generation batch's statistics (the first batch samples at `temperature`). Transformers generation only (the
        official code patches vLLM's sampler). See `trl_groupx/sampling/adaptive_temperature.py`.
    hapo_temperature_tau (`float`, *optional*, defaults to `0.05`):
        HAPO: τ, the largest relative change of the temperature (official `temperature_tau`); `>= 0`, and `< 1`
        with `hapo_temperature_official_sign=False`.
    hapo_temperature_entropy_pivot (`float`, *optional*, defaults to `0.8`):
        HAPO: quantile of the previous batch's log-entropies taken as the pivot `m` (official `entropy_pivot`).
    hapo_temperature_official_sign (`bool`, *optional*, defaults to `False`):
        HAPO: `False` = the paper's signed `ĥ` (colder at low-entropy tokens, hotter at high-entropy ones), the
        reading HAPO's other two parts use too (`token_weighting="hapo"`, `hapo_clip_official_sign=False`);
        `True` = the official sampler's `ĥ ≥ 0` (temperature only raised, most at the lowest and highest
        entropies; `scale_neg = 1/neg_min` in the code).
    edge_grpo_gec (`bool`, *optional*, defaults to `False`):
        EDGE-GRPO's Guided Error Correction (part of the `edge_grpo` catalog id, with `token_weighting="edge_grpo"`):
        every scored training response below `edge_grpo_gec_target_reward` whose prompt is shorter than
        `edge_grpo_gec_max_prompt_tokens` is corrected with the reference (answer or solution branch), re-scored
        and trained on (reflect, answer or solution branch). See `trl_groupx/sampling/edge_grpo_gec.py`.
    edge_grpo_gec_answer_column (`str`, *optional*, defaults to `"answer"`):
        GEC: dataset column with each prompt's final answer (the answer branch appends it in `\boxed{}`).
    edge_grpo_gec_solution_column (`str`, *optional*, defaults to `"solution"`):
        GEC: dataset column with each prompt's reference solution (the solution branch replaces the response).
    edge_grpo_gec_answer_template (`str`, *optional*, defaults to the official text):
        GEC: appended to a wrong response in the answer branch; `{answer}` is replaced (official: `"\nWait! Something
        is wrong here. After verification, the correct answer is \\boxed{answer}."`).
    edge_grpo_gec_answer_share (`float`, *optional*, defaults to `0.25`):
        GEC: probability that a selected response takes the answer branch (official 1/4).
    edge_grpo_gec_solution_share (`float`, *optional*, defaults to `0.25`):
        GEC: probability of the solution branch (official 1/4); the rest (official 1/2) is the reflect branch.
    edge_grpo_gec_target_reward (`float`, *optional*, defaults to `2.0`):
        GEC: the weighted reward of a fully correct response (official 2 = format + accuracy); below it = corrected.
    edge_grpo_gec_max_prompt_tokens (`int`, *optional*, defaults to `256`):
        GEC: only rows whose prompt has fewer tokens are corrected (official 256).
    n_grpo_mix_rate (`float`, *optional*, defaults to `0.1`):
        N-GRPO (`rollout_filter="n_grpo"`): probability that a training generation step feeds, instead of the
        sampled token's embedding, the mix of the argmax token's and its nearest (cosine) neighbours' embeddings,
        weighted by their sampling probabilities (official `mix_rate`); in [0, 1], 0 = plain GRPO. The training
        forwards replay the mixed inputs. See `trl_groupx/sampling/n_grpo.py`.
    n_grpo_top_k (`int`, *optional*, defaults to `2`):
        N-GRPO: mixed candidates including the anchor (official `mix_top_k`: 2 = anchor + its nearest neighbour).
    n_grpo_think_end (`str` or `None`, *optional*, defaults to `"</think>"`):
        N-GRPO: once a completion has generated these tokens no step mixes (official `answer_start`); `None` = mix
        in the whole completion.
    logit_avg_alpha (`float`, *optional*, defaults to `0.5`):
        Logit averaging (`rollout_filter="logit_avg"`): weight α of the trainable policy's logits in the acting
        policy's `α z_θ + (1 − α) z_ref` (paper: the plain average, ½); in (0, 1], 1 = plain GRPO. Needs `beta=0`.
        See `trl_groupx/sampling/logit_avg.py`.
    edge_grpo_gec_reflect_cue (`str`, *optional*, defaults to `" Wait! Something is wrong here."`):
        GEC: appended to a wrong response in the reflect branch before the policy continues it (official text).
    edge_grpo_gec_reflect_max_new_tokens (`int`, *optional*, defaults to `256`):
        GEC: most tokens the policy generates in the reflect branch (official 256; the corrected response is still
        cut at `max_completion_length`).
    repo_strategy (`str`, *optional*, defaults to `"highest_k"`):
        RePO (`rollout_filter="repo"`): which buffered rollouts of a prompt are replayed, `"highest_k"` (largest
        reward sum, official default) or `"recent_k"` (newest). See `trl_groupx/sampling/repo.py`.
    repo_k (`int`, *optional*, defaults to `8`):
        RePO: rollouts replayed per prompt (official `num_replays` 8).
    repo_min_cache (`int`, *optional*, defaults to `16`):
        RePO: a prompt is replayed once its buffer holds this many rollouts (official 16; `repo_k <= repo_min_cache`).
    repo_max_cache (`int`, *optional*, defaults to `16`):
        RePO: most rollouts kept per prompt, oldest dropped first (official 16).
    repo_max_prompts (`int` or `None`, *optional*, defaults to `None`):
        RePO: most prompts kept in the buffer, least recently visited dropped first; `None` = unbounded (official).
    repo_off_coef (`float`, *optional*, defaults to `1.0`):
        RePO: weight `c` of the replayed rows' loss, `L = L_on + c L_off` (official `off_policy_loss_coef` 1.0).
    repo_adv_eps (`float`, *optional*, defaults to `1e-4`):
        RePO: epsilon of the replayed blocks' split normalisation `(r - mean) / (std + eps)` (official 1e-4).
    eframe_extra_n (`int`, *optional*, defaults to `20`):
        EFRame (`rollout_filter="eframe"`): extra rollouts per all-fail prompt (official `additional_n` 20). See
        `trl_groupx/sampling/eframe.py`.
    eframe_extra_temperature (`float`, *optional*, defaults to `1.2`):
        EFRame: sampling temperature of the extra rollouts (official `additional_temperature` 1.2).
    eframe_hard_eps (`float`, *optional*, defaults to `0.01`):
        EFRame: a group is all-fail when every scored reward is below this (official eps 0.01).
    eframe_extra_keep_threshold (`float`, *optional*, defaults to `1.0`):
        EFRame: extra rollouts with `|A| >` this (A within the extra group) are appended (official 1).
    eframe_filter_threshold (`float`, *optional*, defaults to `0.05`):
        EFRame: on-policy rollouts with `|A| <=` this are masked out of the loss (official 0.05).
    eframe_replay_threshold (`float`, *optional*, defaults to `1.0`):
        EFRame: trained rows with `|A| >` this enter the replay buffer (official 1).
    eframe_replay_freq (`int`, *optional*, defaults to `5`):
        EFRame: replay every this many generation batches (official `replay_freq` 5); 0 turns replay off.
    eframe_replay_size (`float`, *optional*, defaults to `2.0`):
        EFRame: buffer capacity in generation batches of rows, `eframe_replay_size × N` (official `replay_size` 2.0).
    lspo_column (`str`, *optional*, defaults to `"solution"`):
        LSPO (`rollout_filter="lspo"`): dataset column holding each prompt's ground-truth solution, the scaffold's SFT
        target. See `trl_groupx/sampling/lspo.py`.
    lspo_success_threshold (`float`, *optional*, defaults to `1.0`):
        LSPO: reward at or above which a rollout counts as solved (a cliff group has none; a re-roll must reach it).
    lspo_lora_r (`int`, *optional*, defaults to `16`):
        LSPO: rank of the scaffold adapter in full fine-tuning (a LoRA policy's scaffold copies the policy adapter).
    lspo_lora_alpha (`float`, *optional*, defaults to `32.0`):
        LSPO: LoRA alpha of the scaffold adapter in full fine-tuning.
    lspo_sft_steps (`int`, *optional*, defaults to `1`):
        LSPO: AdamW steps of the scaffold's SFT on the cliff prompts' solutions, per generation batch.
    lspo_sft_learning_rate (`float`, *optional*, defaults to `1e-4`):
        LSPO: learning rate of the scaffold's SFT.
    lspo_is_cap (`float`, *optional*, defaults to `1.0`):
        LSPO: truncation `C` of a spliced token's importance weight `min(π_θ/π_scaffold, C)`.
    lspo_template (`str`, *optional*, defaults to `"{ref}"`):
        LSPO: SFT target text; `{ref}` is replaced by the solution.
    """

    rollout_filter: str | None = field(
        default=None, metadata={"help": "Sampling-stage variant id (post-generation filter), or None."}
    )
    gfpo_keep: int = field(default=8, metadata={"help": "GFPO: responses kept per group (k < num_generations)."})
    gfpo_metric: str = field(
        default="length", metadata={"help": "GFPO ranking: 'length' (shortest) or 'reward_per_token' (largest)."}
    )
    gfpo_adaptive: bool = field(default=False, metadata={"help": "GFPO: k per group from its success rate."})
    gfpo_adaptive_keep: str = field(
        default="8,8,6,4",
        metadata={"help": "GFPO adaptive: comma-separated k for success rate in [0,.25), [.25,.5), [.5,.75), [.75,1]"},
    )
    d3s_keep_start: float = field(default=0.5, metadata={"help": "D3S: fraction of each group kept at step 0."})
    d3s_keep_end: float = field(default=1.0, metadata={"help": "D3S: fraction of each group kept at the last step."})
    dapo_max_gen_batches: int = field(
        default=10, metadata={"help": "DAPO dynamic sampling: max generation batches per training batch (0 = no cap)."}
    )
    gcpo_ref_column: str = field(
        default="solution", metadata={"help": "GCPO: dataset column with the reference solution of each prompt."}
    )
    gcpo_ref_success_threshold: float = field(
        default=1.0, metadata={"help": "GCPO: reward at or above which a rollout counts as solved."}
    )
    gcpo_ref_template: str = field(
        default="{ref}", metadata={"help": "GCPO: injected completion text; '{ref}' is replaced by the reference."}
    )
    generation_temperatures: list[float] | None = field(
        default=None,
        metadata={"help": "MDP-GRPO: one sampling temperature per completion of a group (len = num_generations)."},
    )
    generation_micro_group_size: int | None = field(
        default=None,
        metadata={"help": "Micro sampling groups: generate() at most this many sequences at a time (None = off)."},
    )
    vade_success_threshold: float = field(
        default=1.0, metadata={"help": "VADE: reward at or above which a rollout counts as a success."}
    )
    vade_decay_slow: float = field(
        default=0.99, metadata={"help": "VADE: per-batch decay of every posterior toward the prior, in (0, 1]."}
    )
    vade_decay_fast: float = field(
        default=0.8, metadata={"help": "VADE: extra decay of a revisited prompt's posterior, in (0, 1]."}
    )
    v0_value_predictor: str = field(
        default="knn", metadata={"help": "V₀: registered name of the value model ('knn' = built-in toy predictor)."}
    )
    v0_value_epsilon: float = field(
        default=0.05, metadata={"help": "V₀: skip prompts predicted within this of 0 or 1, in [0, 0.5)."}
    )
    v0_value_context_size: int = field(
        default=256, metadata={"help": "V₀: most (prompt, success rate) pairs in the context."}
    )
    v0_value_pool_size: int = field(
        default=0, metadata={"help": "V₀: candidate prompts scored per generation batch (0 = whole dataset)."}
    )
    v0_value_success_threshold: float = field(
        default=1.0, metadata={"help": "V₀: reward at or above which a rollout counts as a success."}
    )
    pilot_commit_pilot_samples: int | None = field(
        default=None, metadata={"help": "Pilot-Commit: pilot rollouts per candidate prompt (None = num_generations // 4)."}
    )
    pilot_commit_reused_pilots: int | None = field(
        default=None, metadata={"help": "Pilot-Commit: pilot rollouts trained in a committed group (None = all; 0 = none)."}
    )
    pilot_commit_pilot_prompts: int = field(
        default=0, metadata={"help": "Pilot-Commit: candidates piloted per round (0 = the batch's prompt count)."}
    )
    pilot_commit_band_low: float = field(
        default=0.125, metadata={"help": "Pilot-Commit: lowest pilot accuracy of a committed prompt."}
    )
    pilot_commit_band_high: float = field(
        default=0.75, metadata={"help": "Pilot-Commit: highest pilot accuracy of a committed prompt."}
    )
    pilot_commit_exclude_threshold: float | None = field(
        default=1.0, metadata={"help": "Pilot-Commit: pilot accuracy at or above which a prompt is excluded (None = off)."}
    )
    pilot_commit_off_steps: int = field(
        default=4, metadata={"help": "Pilot-Commit: generation batches a buffered prompt may wait."}
    )
    pilot_commit_selection: str = field(
        default="random", metadata={"help": "Pilot-Commit: buffer rule: random, max_variance or most_recent."}
    )
    pilot_commit_max_rounds: int = field(
        default=10, metadata={"help": "Pilot-Commit: most pilot rounds per generation batch (0 = no limit)."}
    )
    pilot_commit_success_threshold: float = field(
        default=1.0, metadata={"help": "Pilot-Commit: reward at or above which a pilot rollout is correct."}
    )
    sgpo_profile_samples: int = field(
        default=4, metadata={"help": "sGPO: profiling completions per training prompt under the initial policy (>= 2)."}
    )
    sgpo_success_threshold: float = field(
        default=0.5, metadata={"help": "sGPO: a profiling completion with reward above this is a success."}
    )
    sgpo_unsolvable_keep: float = field(
        default=0.1, metadata={"help": "sGPO: fraction of never-solved prompts (p̂ = 0) kept, in [0, 1]."}
    )
    sgpo_order: str = field(
        default="easy_to_hard", metadata={"help": "sGPO: 'easy_to_hard' (paper), 'hard_to_easy' or 'shuffled'."}
    )
    sgpo_group_size: str = field(
        default="inverse_success",
        metadata={"help": "sGPO: 'inverse_success' (G = ceil(1/p̂), paper) or 'fixed' (num_generations each)."},
    )
    sgpo_max_group_size: int | None = field(
        default=None, metadata={"help": "sGPO: largest group under 'inverse_success' (None = num_generations)."}
    )
    ebpo_curriculum_mode: str = field(
        default="difficulty", metadata={"help": "EBPO clustered sampling: 'difficulty' (easy -> hard) or 'topic'."}
    )
    ebpo_curriculum_samples: int = field(
        default=16, metadata={"help": "EBPO clustered sampling: profiling rollouts per prompt (paper: 16)."}
    )
    ebpo_curriculum_success_threshold: float = field(
        default=0.5, metadata={"help": "EBPO clustered sampling: reward above which a profiling rollout is correct."}
    )
    ebpo_curriculum_topic_column: str | None = field(
        default=None, metadata={"help": "EBPO clustered sampling, topic mode: the dataset column of topic labels."}
    )
    soup_mixed_rollouts: int = field(
        default=1, metadata={"help": "SOUP: rollouts per group that continue a stored off-policy prefix."}
    )
    soup_prefix_fraction: float = field(
        default=0.5, metadata={"help": "SOUP: share of a stored rollout's tokens kept as prefix, in [0, 1)."}
    )
    igrpo_num_drafts: int | None = field(
        default=None, metadata={"help": "iGRPO: stage-1 drafts per prompt (None = num_generations)."}
    )
    igrpo_draft_template: str = field(
        default=IGRPO_DRAFT_TEMPLATE,
        metadata={"help": "iGRPO: text appended to the prompt in stage 2; '{draft}' is replaced by the best draft."},
    )
    rc_grpo_prompt_condition_tokens: list[str] = field(
        default_factory=lambda: list(DEFAULT_CONDITION_TOKENS),
        metadata={"help": "RC-GRPO: reward-goal tokens, one per training rollout's prompt (single tokens of the "
                          "RCTP checkpoint's tokenizer)."},
    )
    rc_grpo_condition_mix: list[float] = field(
        default_factory=lambda: list(DEFAULT_CONDITION_MIX),
        metadata={"help": "RC-GRPO: share of each group conditioned on each token (sums to 1)."},
    )
    consistency_grpo_column: str = field(
        default=CONSISTENCY_GRPO_COLUMN,
        metadata={"help": "consistency_grpo: dataset column with each row's list of paraphrased prompts."},
    )
    s2l_po_explorer_model: str | None = field(
        default=None, metadata={"help": "S2L-PO: model id or local path of the smaller explorer (same tokenizer)."}
    )
    s2l_po_anneal_steps: int = field(
        default=8, metadata={"help": "S2L-PO: official N, logical steps annealing explorer batches to none (0 = GRPO)."}
    )
    s2l_po_group_sizes: str = field(
        default="official", metadata={"help": "S2L-PO: 'official' (annealed rollouts per prompt) or 'fixed'."}
    )
    sage_column: str = field(
        default="solution", metadata={"help": "SAGE: dataset column with the reference solution hints come from."}
    )
    sage_success_threshold: float = field(
        default=0.0, metadata={"help": "SAGE: a group is solved when a rollout's reward is strictly above this."}
    )
    sage_hint_instruction: str = field(
        default=SAGE_HINT_INSTRUCTION, metadata={"help": "SAGE: system text of the hint request (JSON, 3 levels)."}
    )
    sage_hint_request_template: str = field(
        default=SAGE_HINT_REQUEST_TEMPLATE,
        metadata={"help": "SAGE: user text of the hint request; '{question}' and '{solution}' are replaced."},
    )
    sage_hint_template: str = field(
        default=SAGE_HINT_TEMPLATE,
        metadata={"help": "SAGE: appended to a re-rolled group's prompt; '{hint}' is replaced by the hint."},
    )
    sage_method: str = field(
        default="sage", metadata={"help": "SAGE: 'sage' (re-roll unsolved groups) or 'light' (per-prompt levels)."}
    )
    sage_light_accuracy_min: float = field(
        default=0.0, metadata={"help": "SAGE-light: last accuracy <= this -> next hint level (official 0)."}
    )
    sage_light_accuracy_max: float = field(
        default=0.35, metadata={"help": "SAGE-light: last accuracy > this -> previous hint level (official 0.35)."}
    )
    hapo_adaptive_temperature: bool = field(
        default=False, metadata={"help": "HAPO: per-token sampling temperature from the next-token entropy."}
    )
    hapo_temperature_tau: float = field(
        default=0.05, metadata={"help": "HAPO adaptive temperature: tau, temperature in T(1 +- tau)."}
    )
    hapo_temperature_entropy_pivot: float = field(
        default=0.8, metadata={"help": "HAPO adaptive temperature: pivot quantile of the previous batch's entropies."}
    )
    hapo_temperature_official_sign: bool = field(
        default=False, metadata={"help": "HAPO adaptive temperature: official unsigned h_hat (default: paper's sign)."}
    )
    edge_grpo_gec: bool = field(
        default=False, metadata={"help": "EDGE-GRPO Guided Error Correction of wrong responses with the reference."}
    )
    edge_grpo_gec_answer_column: str = field(
        default="answer", metadata={"help": "EDGE-GRPO GEC: dataset column with each prompt's final answer."}
    )
    edge_grpo_gec_solution_column: str = field(
        default="solution", metadata={"help": "EDGE-GRPO GEC: dataset column with each prompt's reference solution."}
    )
    edge_grpo_gec_answer_template: str = field(
        default=GEC_ANSWER_TEMPLATE,
        metadata={"help": "EDGE-GRPO GEC: appended to a wrong response in the answer branch; '{answer}' is replaced."},
    )
    edge_grpo_gec_answer_share: float = field(
        default=0.25, metadata={"help": "EDGE-GRPO GEC: probability of the answer branch (official 0.25)."}
    )
    edge_grpo_gec_solution_share: float = field(
        default=0.25, metadata={"help": "EDGE-GRPO GEC: probability of the solution branch (official 0.25)."}
    )
    edge_grpo_gec_target_reward: float = field(
        default=2.0, metadata={"help": "EDGE-GRPO GEC: reward of a fully correct response; below it = corrected."}
    )
    edge_grpo_gec_max_prompt_tokens: int = field(
        default=256, metadata={"help": "EDGE-GRPO GEC: only prompts shorter than this are corrected (official 256)."}
    )
    n_grpo_mix_rate: float = field(
        default=0.1, metadata={"help": "N-GRPO: probability that a generation step feeds the neighbour mix."}
    )
    n_grpo_top_k: int = field(
        default=2, metadata={"help": "N-GRPO: mixed candidates including the anchor (official mix_top_k)."}
    )
    n_grpo_think_end: str | None = field(
        default="</think>", metadata={"help": "N-GRPO: no mixing once a completion has generated this (None = never)."}
    )
    logit_avg_alpha: float = field(
        default=0.5, metadata={"help": "Logit averaging: weight of the policy's logits in α z_θ + (1 − α) z_ref."}
    )
    edge_grpo_gec_reflect_cue: str = field(
        default=GEC_REFLECT_CUE,
        metadata={"help": "EDGE-GRPO GEC: appended to a wrong response before the policy continues it (reflect)."},
    )
    edge_grpo_gec_reflect_max_new_tokens: int = field(
        default=256, metadata={"help": "EDGE-GRPO GEC: most tokens generated in the reflect branch (official 256)."}
    )
    repo_strategy: str = field(
        default="highest_k", metadata={"help": "RePO: replayed rollouts of a prompt, 'highest_k' or 'recent_k'."}
    )
    repo_k: int = field(default=8, metadata={"help": "RePO: rollouts replayed per prompt (official 8)."})
    repo_min_cache: int = field(
        default=16, metadata={"help": "RePO: buffered rollouts a prompt needs before it is replayed (official 16)."}
    )
    repo_max_cache: int = field(default=16, metadata={"help": "RePO: most rollouts kept per prompt (official 16)."})
    repo_max_prompts: int | None = field(
        default=None, metadata={"help": "RePO: most prompts kept in the buffer (LRU); None = unbounded."}
    )
    repo_off_coef: float = field(default=1.0, metadata={"help": "RePO: weight of the replayed rows' loss (official 1)."})
    repo_adv_eps: float = field(
        default=1e-4, metadata={"help": "RePO: epsilon of the replayed blocks' advantage normalisation (official 1e-4)."}
    )
    eframe_extra_n: int = field(default=20, metadata={"help": "EFRame: extra rollouts per all-fail prompt (20)."})
    eframe_extra_temperature: float = field(
        default=1.2, metadata={"help": "EFRame: sampling temperature of the extra rollouts (official 1.2)."}
    )
    eframe_hard_eps: float = field(default=0.01, metadata={"help": "EFRame: all-fail when every reward < this."})
    eframe_extra_keep_threshold: float = field(
        default=1.0, metadata={"help": "EFRame: extra rollouts with |A| > this are appended (official 1)."}
    )
    eframe_filter_threshold: float = field(
        default=0.05, metadata={"help": "EFRame: rollouts with |A| <= this are masked out (official 0.05)."}
    )
    eframe_replay_threshold: float = field(
        default=1.0, metadata={"help": "EFRame: trained rows with |A| > this enter the replay buffer (official 1)."}
    )
    eframe_replay_freq: int = field(
        default=5, metadata={"help": "EFRame: replay every this many generation batches (official 5); 0 = off."}
    )
    eframe_replay_size: float = field(
        default=2.0, metadata={"help": "EFRame: buffer capacity in generation batches of rows (official 2.0)."}
    )
    lspo_column: str = field(
        default="solution", metadata={"help": "LSPO: dataset column with each prompt's ground-truth solution."}
    )
    lspo_success_threshold: float = field(
        default=1.0, metadata={"help": "LSPO: reward at or above which a rollout counts as solved."}
    )
    lspo_lora_r: int = field(default=16, metadata={"help": "LSPO: scaffold LoRA rank (full fine-tuning)."})
    lspo_lora_alpha: float = field(default=32.0, metadata={"help": "LSPO: scaffold LoRA alpha (full fine-tuning)."})
    lspo_sft_steps: int = field(default=1, metadata={"help": "LSPO: scaffold SFT steps per generation batch."})
    lspo_sft_learning_rate: float = field(default=1e-4, metadata={"help": "LSPO: scaffold SFT learning rate."})
    lspo_is_cap: float = field(
        default=1.0, metadata={"help": "LSPO: truncation C of a spliced token's weight min(pi_theta/pi_scaffold, C)."}
    )
    lspo_template: str = field(
        default="{ref}", metadata={"help": "LSPO: SFT target text; '{ref}' is replaced by the solution."}
    )

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[misc]
        from .micro_groups import validate as validate_micro_groups

        validate_micro_groups(self)
        from .temperatures import validate as validate_temperatures

        validate_temperatures(self)
        from .adaptive_temperature import validate as validate_adaptive_temperature

        validate_adaptive_temperature(self)
        from .edge_grpo_gec import validate as validate_edge_grpo_gec

        validate_edge_grpo_gec(self)
