"""SPO (Single-stream Policy Optimization): a persistent per-prompt value tracker replaces the group baseline
(arXiv:2509.13232)."""

from __future__ import annotations

import torch

from ..contracts import nan_std
from ..registry import register
from ._checks import reject_infinite

SPO_NORM_EPS = 1e-8  # official: (A - mean) / (A.std() + 1e-8)
SPO_PRIOR_ALPHA = SPO_PRIOR_BETA = 0.5  # official offline_N = 0 branch: alpha = beta = 0.5 (p_hat = 0.5, count 1)
SPO_INITS = ("prior", "first_group")
SPO_RHO_MODES = ("constant", "kl")


def spo_rho_from_kl(prompt_kl: torch.Tensor, half_life: float, rho_min: float, rho_max: float) -> torch.Tensor:
    """`ρ = clip(2^(−D/half_life), rho_min, rho_max)` per element; NaN `D` (a prompt never visited) counts as
    `D = 0` (official: its old log-probs are its current ones), so it gets `rho_max`."""
    d = torch.nan_to_num(prompt_kl.detach().cpu().to(torch.float64), nan=0.0)
    return torch.pow(2.0, -d / half_life).clamp(min=rho_min, max=rho_max)


def _validate(config) -> None:
    rho = config.spo_single_rho
    if not 0.0 <= rho <= 1.0:
        raise ValueError(f"spo_single_rho must be in [0, 1] (forgetting factor of the tracker), got {rho!r}.")
    if config.spo_single_init not in SPO_INITS:
        raise ValueError(f"spo_single_init must be one of {SPO_INITS}, got {config.spo_single_init!r}.")
    mode = config.spo_single_rho_mode
    if mode not in SPO_RHO_MODES:
        raise ValueError(f"spo_single_rho_mode must be one of {SPO_RHO_MODES}, got {mode!r}.")
    lo, hi = config.spo_single_rho_min, config.spo_single_rho_max
    if not 0.0 <= lo <= hi <= 1.0:
        raise ValueError(f"spo_single_rho_min and spo_single_rho_max must satisfy 0 <= min <= max <= 1 (the clip of "
                         f"the KL-adaptive rho), got min={lo!r}, max={hi!r}.")
    half_life = config.spo_single_kl_half_life
    if not (isinstance(half_life, (int, float)) and half_life > 0 and half_life != float("inf")):
        raise ValueError(f"spo_single_kl_half_life must be a finite number > 0 (the D at which 2^(-D/h) = 1/2), "
                         f"got {half_life!r}.")
    init_rho = rho if mode == "constant" else lo
    if config.spo_single_init == "first_group" and init_rho >= 1.0:
        name = "spo_single_rho" if mode == "constant" else "spo_single_rho_min"
        raise ValueError(f"spo_single_init='first_group' sizes the initial tracker as 1/(1 - {name}): set "
                         f"{name} < 1 or use spo_single_init='prior'.")


def spo_tracker_lookup(state: dict, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`(alpha_beta (U, 2) float64, found (U,) bool)` of the tracker entries of `keys (U,)` (0 where not found)."""
    stored_keys, stored = state["keys"], state["values"]
    if stored_keys.numel() == 0:
        return torch.zeros(keys.numel(), 2, dtype=torch.float64), torch.zeros(keys.numel(), dtype=torch.bool)
    pos = torch.searchsorted(stored_keys, keys).clamp(max=stored_keys.numel() - 1)
    found = stored_keys[pos] == keys
    return torch.where(found.unsqueeze(1), stored[pos], torch.zeros_like(stored[pos])), found


@register(
    "spo_single",
    name="SPO (Single-stream Policy Optimization)",
    paper="Single-stream Policy Optimization, arXiv:2509.13232",
    official_code="verl-project/verl-recipe@48ea0a797fa29867ea0ad92aff7d284eec7d4be3:spo/spo_ray_trainer.py",
    stage="advantages",
    flags={"advantage_estimator": "spo_single", "spo_single_rho_mode": "kl", "spo_single_kl_half_life": 0.06,
           "spo_single_rho_min": 0.875, "spo_single_rho_max": 0.96, "spo_single_init": "prior",
           "spo_single_batch_norm": True},
    params=("spo_single_rho", "spo_single_init", "spo_single_batch_norm", "spo_single_rho_mode",
            "spo_single_kl_half_life", "spo_single_rho_min", "spo_single_rho_max"),
    requires=("prompt_keys", "prompt_kl"),
    stateful=True,
    validate=_validate,
)
def spo_single_advantages(
    rewards: torch.Tensor,
    group_size: int,
    *,
    prompt_keys: torch.Tensor,
    prompt_kl: torch.Tensor | None = None,
    spo_single_rho: float = 0.875,
    spo_single_init: str = "prior",
    spo_single_batch_norm: bool = True,
    spo_single_rho_mode: str = "constant",
    spo_single_kl_half_life: float = 0.06,
    spo_single_rho_min: float = 0.875,
    spo_single_rho_max: float = 0.96,
    state: dict,
) -> torch.Tensor:
    r"""SPO: advantages against a persistent per-prompt value tracker, normalised over the whole batch.

    Tracker (one entry per distinct prompt `x`, kept in `state` across steps): Beta-style counts `(α_x, β_x)` with
    `v̂(x) = α_x / (α_x + β_x)`. Advantages use the tracker *before* this batch's rewards:

    `A_i = r_i − v̂(x_i)`, then (`spo_single_batch_norm=True`) `A_i ← (A_i − mean(A)) / (std(A) + 1e-8)` over all
    scored rollouts of the global batch (unbiased std, as `torch.Tensor.std`).

    Then every prompt visited in the batch, with `n_x` scored rollouts of reward sum `s_x`, is updated once:

    `α_x ← ρ α_x + s_x`,  `β_x ← ρ β_x + (n_x − s_x)`   (ρ = `spo_single_rho`, or per prompt from its drift D, below).

    So `v̂` becomes the discounted mean `v̂' = w v̂ + (1 − w) s_x/n_x` with `w = ρ(α+β) / (ρ(α+β) + n_x)`: after
    rewards 1, 1, 0 (one group of three, or three single visits) it moves toward 2/3, and a prompt that keeps
    scoring 1,1,0 converges to exactly 2/3 with effective count `(α+β) → n_x/(1−ρ)`. With binary rewards `(α, β)`
    are the Beta posterior counts of the paper; for other rewards they stay well defined (`α + β > 0`; `v̂` is the
    discounted running mean), so rewards outside [0, 1] are accepted.

    Shapes: `rewards (N,)`, `prompt_keys (N,)` int64 (the trainer's stable hash of each row's prompt, requirement
    `"prompt_keys"`) → `(N,)`. No group statistic is used: `group_size` is only the layout, and `G = 1` gives the
    non-zero `A = r − v̂(x)` that a group baseline cannot (in the pure function: TRL's `GRPOConfig` itself refuses
    `num_generations < 2`, so a training run uses `G ≥ 2`, the recipe `G = 2`).

    State: `keys (M,) int64` sorted ascending and `values (M, 2) float64` (`α`, `β`), one row per prompt ever
    scored; merged with `searchsorted`/`sort`. It grows by 24 bytes per distinct prompt (1M prompts ≈ 24 MB) and is
    bounded by the dataset's number of distinct prompts; it is not pruned (pruning would change `v̂` of a prompt
    seen again later).

    Citation: verl-project/verl-recipe@48ea0a797fa29867ea0ad92aff7d284eec7d4be3, spo/spo_ray_trainer.py:
    `RaySPOTrainer.fit` — offline initialisation l.356-376 (`N_init = 1/(1 − clip_lower)` l.369,
    `α = N_init (Σscores + 0.5)/(N + 1)`, `β = N_init (N − Σscores + 0.5)/(N + 1)` l.371-372 with scores binarised
    `int(s > 0)` l.359, `α = β = 0.5` when `offline_N = 0` l.362-364); prioritised prompt sampling l.379-432
    (weight `√(p̂(1−p̂)) + 0.05`); advantage `r − p̂` l.547 and `(A − A.mean())/(A.std() + 1e-8)` l.551; update
    `α = ρα + r`, `β = ρβ + (1 − r)` l.664-665 (after the actor update, so the step's advantage uses the old
    tracker). `RaySPOTrainer._get_spo_rho` l.240-305: `type="constant"` gives `ρ = rho.value` (0.875,
    spo/config/spo_trainer.yaml l.13-20); `type="kl"` (default) gives `ρ = clip(2^(−D/0.06), clip_lower=0.875,
    0.96)` with `D` the masked mean of `|log π_old − log π_cur|` on the prompt's *stored previous response*, `π_old`
    the policy right after that prompt's last update (l.258-303: a prompt not yet stored re-scores its own current
    response against itself, D = 0, l.262-283; after ρ, the batch's responses and their log-probs under the
    updated policy replace the stored ones, l.296-301; `_get_spo_rho` is called after `update_actor`, l.653-660).
    The official SPO script samples one response per
    prompt (spo/train.sh l.65, `n_resp_per_prompt=1`).

    What an online trainer reproduces, and **our choices**:

    - **ρ** (`spo_single_rho_mode`): `"kl"` is the official default rule, `ρ_x = clip(2^(−D_x/h), ρ_min, ρ_max)`
      with `h = spo_single_kl_half_life` (0.06), `ρ_min = spo_single_rho_min` (0.875 = official `clip_lower`),
      `ρ_max = spo_single_rho_max` (0.96, hard-coded in the official code), `D_x = prompt_kl` of the prompt (NaN for
      a prompt never seen → `D = 0` → `ρ_max`, as official, where such a prompt's old log-probs are its current
      ones). `"constant"` uses `spo_single_rho` for every prompt (official `rho.type="constant"`).
      **Choice: the config default stays `"constant"`** so that a run that only sets
      `advantage_estimator="spo_single"` (and every existing config and checkpoint) keeps its numbers and its cost;
      `"kl"` costs two extra no-grad forwards per generation batch and a stored response per prompt. The
      registered flags and `recipes/spo_single.yaml` (the paper's setting) turn `"kl"` on.
    - **What D compares** (trainer side, `trl_groupx/advantages/prompt_kl.py`): per prompt key the trainer keeps
      the last visit's response (the last scored rollout of the prompt, as the official loop's last row wins) with
      its per-token log-probs under the policy that generated that batch, re-scores it with the current policy
      and passes the masked mean `D = mean |log π_stored − log π_current|` (completion tokens, tool tokens
      excluded). The official code computes ρ *after* the actor update of visit `t` and stores log-probs under
      the updated policy: its D compares θ_{s+1} with θ_{t+1} (`s` the prompt's previous visit). Here the
      advantage is computed before the update of visit `t` and the tracker update is applied at once (the
      official order gives the same advantages: this step's advantage reads the tracker before its update), so D
      compares θ_s with θ_t: **the same number `t − s` of policy updates, the window shifted one update
      earlier** (exact when every update moves the prompt's log-probs by the same amount). Exact official
      timing would defer each tracker update to the next generation batch; not done.
    - With `G > 1` rows of one prompt, all rows share the prompt's D and ρ (one decay per visit).
    - **No offline pass.** `spo_single_init="prior"` (default) starts every new prompt at `α = β = 0.5` (the
      official `offline_N = 0` branch): its first advantage is `r − 0.5`, then the update applies.
      `"first_group"` initialises a new prompt from its first group with the official offline formula
      (`N_init = 1/(1 − ρ)`, raw rewards instead of `int(s > 0)`), uses that `v̂` for the group's own advantages
      (the group's rewards are in its baseline, as GRPO's mean is) and does not add the group a second time.
    - **G > 1**: the official loop writes one row's update per prompt (the last row wins when a prompt repeats).
      We decay once per visit and add every scored rollout of the prompt in the batch (identical for `G = 1`);
      all rows of the prompt share the pre-update `v̂`. Repeated prompts in different groups of one batch are
      one visit (the tracker is keyed by prompt, not by group).
    - NaN rewards get advantage 0, are excluded from the batch mean/std, and do not update the tracker (a prompt
      with no scored rollout is not visited: no decay either). With fewer than two scored rollouts the batch std
      counts as 0 (then `A − mean` is 0 for the single one). ±inf raises.
    - The tracker-driven prioritised prompt sampling (weights `√(v̂(1−v̂)) + 0.05` over the dataset's prompts) is
      a separate sampling-stage flag, `rollout_filter="spo_prioritized"` (`trl_groupx/sampling/spo_prioritized.py`),
      which reads this tracker.

    Args:
        rewards (`torch.Tensor`): `(N,)` rewards (NaN where unscored; ±inf raises).
        group_size (`int`): `G` (layout only).
        prompt_keys (`torch.Tensor`): `(N,)` int64 stable key of each rollout's prompt.
        prompt_kl (`torch.Tensor` or `None`): `(N,)` drift D of each row's prompt since its last visit (NaN for a
            new prompt; requirement `"prompt_kl"`); read only with `spo_single_rho_mode="kl"`.
        spo_single_rho (`float`): constant forgetting factor ρ in [0, 1] (`spo_single_rho_mode="constant"`).
        spo_single_init (`str`): `"prior"` or `"first_group"`.
        spo_single_batch_norm (`bool`): normalise `r − v̂` over the batch (official) or return it raw.
        spo_single_rho_mode (`str`): `"constant"` or `"kl"` (ρ from D).
        spo_single_kl_half_life (`float`): `h` > 0 in `2^(−D/h)` (official 0.06).
        spo_single_rho_min (`float`), spo_single_rho_max (`float`): clip of the KL-adaptive ρ (0.875, 0.96).
        state (`dict`): `{"keys", "values"}`, read and updated in place.

    Returns:
        `torch.Tensor`: `(N,)` finite advantages.
    """
    reject_infinite(rewards, "spo_single")
    if rewards.dim() != 1:
        raise ValueError(f"advantage_estimator='spo_single' needs rewards of shape (N,); got {tuple(rewards.shape)}.")
    if rewards.shape[0] % group_size != 0:
        raise ValueError(f"{rewards.shape[0]} rollouts do not split into groups of {group_size}.")
    keys = torch.as_tensor(prompt_keys).detach().cpu().to(torch.int64)
    if keys.shape != rewards.shape:
        raise ValueError(f"spo_single: prompt_keys must have shape {tuple(rewards.shape)}, got {tuple(keys.shape)}.")
    if not state:
        state.update({"keys": torch.zeros(0, dtype=torch.int64), "values": torch.zeros(0, 2, dtype=torch.float64)})
    if spo_single_rho_mode not in SPO_RHO_MODES:
        raise ValueError(f"spo_single_rho_mode must be one of {SPO_RHO_MODES}, got {spo_single_rho_mode!r}.")
    if spo_single_rho_mode == "kl":
        if prompt_kl is None:
            raise ValueError("spo_single_rho_mode='kl' needs prompt_kl (N,): the per-prompt drift D (NaN for a new "
                             "prompt), which the trainer computes for the requirement 'prompt_kl'.")
        prompt_kl = torch.as_tensor(prompt_kl).detach().cpu().to(torch.float64)
        if prompt_kl.shape != rewards.shape:
            raise ValueError(f"spo_single: prompt_kl must have shape {tuple(rewards.shape)}, "
                             f"got {tuple(prompt_kl.shape)}.")

    r = rewards.detach().to(torch.float64).cpu()
    scored = ~torch.isnan(r)
    unique, inverse = torch.unique(keys, return_inverse=True)  # sorted
    n_u = torch.zeros(unique.numel(), dtype=torch.float64).index_add_(0, inverse, scored.to(torch.float64))
    s_u = torch.zeros(unique.numel(), dtype=torch.float64).index_add_(0, inverse, torch.nan_to_num(r, nan=0.0))
    visited = n_u > 0

    if spo_single_rho_mode == "kl":  # one D per prompt: every row of a prompt carries the same value
        first_row = torch.full((unique.numel(),), keys.numel(), dtype=torch.int64).scatter_reduce(
            0, inverse, torch.arange(keys.numel()), reduce="amin")
        d_u = prompt_kl[first_row]
        if not torch.equal(torch.nan_to_num(d_u[inverse], nan=-1.0), torch.nan_to_num(prompt_kl, nan=-1.0)):
            raise ValueError("spo_single: rows of one prompt carry different prompt_kl values.")
        rho_u = spo_rho_from_kl(d_u, spo_single_kl_half_life, spo_single_rho_min, spo_single_rho_max)
        init_rho = spo_single_rho_min  # official: N_init = 1/(1 - clip_lower)
    else:
        rho_u = torch.full((unique.numel(),), float(spo_single_rho), dtype=torch.float64)
        init_rho = spo_single_rho

    ab, found = spo_tracker_lookup(state, unique)
    prior = torch.tensor([SPO_PRIOR_ALPHA, SPO_PRIOR_BETA], dtype=torch.float64).expand_as(ab)
    ab = torch.where(found.unsqueeze(1), ab, prior)
    from_group = visited & ~found & (spo_single_init == "first_group")
    if from_group.any():  # official offline formula (fit l.369-372) on the prompt's first group
        n_init = 1.0 / (1.0 - init_rho)
        init = torch.stack([n_init * (s_u + 0.5) / (n_u + 1), n_init * (n_u - s_u + 0.5) / (n_u + 1)], dim=1)
        ab = torch.where(from_group.unsqueeze(1), init, ab)

    v_hat = (ab[:, 0] / ab.sum(dim=1))[inverse]  # (N,) pre-update tracker value of each row's prompt
    advantages = r - v_hat  # NaN where unscored
    if spo_single_batch_norm:
        std = nan_std(advantages).nan_to_num(0.0)
        advantages = (advantages - torch.nanmean(advantages)) / (std + SPO_NORM_EPS)
    advantages = torch.nan_to_num(advantages, nan=0.0)

    # --- update (official: after the actor step; here after the advantages, same effect) ---
    updated = torch.stack([rho_u * ab[:, 0] + s_u, rho_u * ab[:, 1] + (n_u - s_u)], dim=1)
    updated = torch.where(from_group.unsqueeze(1), ab, updated)  # the first group *is* the initialisation
    old_keys, old_values = state["keys"], state["values"]
    if old_keys.numel():
        pos = torch.searchsorted(old_keys, unique[visited & found])
        old_values = old_values.clone()
        old_values[pos] = updated[visited & found]
    new = visited & ~found
    merged_keys = torch.cat([old_keys, unique[new]])
    merged_values = torch.cat([old_values, updated[new]])
    order = torch.argsort(merged_keys)
    state["keys"], state["values"] = merged_keys[order], merged_values[order]
    return advantages.to(rewards.dtype).to(rewards.device)
