"""GVPO (`loss_type="gvpo"`): group-centred implicit rewards β·Σ_t log(π/π_old) regressed onto group-centred rewards."""

import math
from types import SimpleNamespace

import pytest
import torch

from trl_groupx import GRPOConfig, get_variant
from trl_groupx.contracts import ObjectiveContext
from trl_groupx.objective import aggregate, gvpo_surrogate


def gvpo_loss(ctx, beta):
    """Total loss as the trainer forms it (one micro-batch, no accumulation): paper default `sequence_mean`."""
    return aggregate(gvpo_surrogate(ctx, gvpo_beta=beta), ctx.mask, "sequence_mean")


def make_ctx(log_ratio, adv, mask, group_ids, old=None):
    """`logps = old + log_ratio` (leaf with grad); `old` defaults to a fixed negative tensor."""
    log_ratio = torch.as_tensor(log_ratio, dtype=torch.float64)
    old = -1.0 - torch.arange(log_ratio.numel(), dtype=torch.float64).view_as(log_ratio) / 10 if old is None else old
    logps = (old + log_ratio).detach().requires_grad_()
    adv = torch.as_tensor(adv, dtype=torch.float64)
    adv = adv.unsqueeze(-1) if adv.dim() == 1 else adv
    ctx = ObjectiveContext(logps, old, adv, torch.as_tensor(mask, dtype=torch.float64),
                           group_ids=torch.as_tensor(group_ids))
    return ctx, logps


def official_loss(log_ratio, adv, mask, group_ids, beta, n):
    """The official `compute_policy_loss_gvpo` formula written out one row at a time (jszkc/GVPO@627aa25e:
    GVPO/gvpo_core_algos.py l.39-60): rθ_i = β(Σ_t logp·m − Σ_t old·m); Â_i = Σ_t A·m / Σ_t m; m_g = mean of the
    *detached* rθ over the uid's rows; loss = Σ_{rows of the micro-batch} ½((rθ_i − m_g) − Â_i)² / (n − 1)."""
    rows = range(log_ratio.shape[0])
    r_theta = [beta * sum(log_ratio[i, t] * mask[i, t] for t in range(mask.shape[1])) for i in rows]
    target = [sum(adv[i, t] * mask[i, t] for t in range(mask.shape[1])) / sum(mask[i]) for i in rows]
    means = {}
    for u in set(group_ids.tolist()):
        members = [r_theta[i].detach() for i in rows if int(group_ids[i]) == u]
        assert len(members) == n
        means[u] = sum(members) / n
    total = 0.0
    for i in rows:
        total = total + 0.5 * ((r_theta[i] - means[int(group_ids[i])]) - target[i]) ** 2
    return total / (n - 1)


# Hand fixture: two groups of n = 4 (ids 7 and 3), rows shuffled, β = 0.5, some rows padded.
# group 7: Σ_t d = [2, 0, -2, 4] → rθ = [1, 0, -1, 2], m = .5, rθ−m = [.5, -.5, -1.5, 1.5];
#          rewards [1, 0, 0, 1] → Â = [.5, -.5, -.5, .5];  c − Â = [0, 0, -1, 1]; ½(c−Â)² = [0, 0, .5, .5] → Σ = 1
# group 3: Σ_t d = [0, 2, 4, 6] → rθ = [0, 1, 2, 3], m = 1.5, rθ−m = [-1.5, -.5, .5, 1.5];
#          rewards [0, 0, 1, 1] → Â = [-.5, -.5, .5, .5]; c − Â = [-1, 0, 0, 1]; ½(c−Â)² = [.5, 0, 0, .5] → Σ = 1
# paper/official per group: Σ/(n−1) = 1/3; official micro-batch loss (both groups) = 2/3; ours = mean over groups 1/3.
# per row ℓ_i = ½(c−Â)²·n/(n−1) = ½(c−Â)²·4/3; gradient on each real token: β·(c−Â)·(4/3)/B = .5·(4/3)/8·(c−Â)
#   = (c−Â)/12.
GROUP_IDS = [7, 3, 3, 7, 7, 3, 7, 3]
ROW_SUMS = [2.0, 0.0, 2.0, 0.0, -2.0, 4.0, 4.0, 6.0]  # group 7 rows in order: 2, 0, -2, 4; group 3: 0, 2, 4, 6
ADV = [0.5, -0.5, -0.5, -0.5, -0.5, 0.5, 0.5, 0.5]
C_MINUS_A = [0.0, -1.0, 0.0, 0.0, -1.0, 0.0, 1.0, 1.0]
LENGTHS = [3, 2, 1, 3, 2, 3, 1, 2]


def hand_fixture():
    t = 3
    mask = torch.zeros(8, t, dtype=torch.float64)
    log_ratio = torch.zeros(8, t, dtype=torch.float64)
    for i, (s, n_tok) in enumerate(zip(ROW_SUMS, LENGTHS)):
        mask[i, :n_tok] = 1
        log_ratio[i, :n_tok] = s / n_tok
        log_ratio[i, n_tok:] = 50.0  # padding: never read
    return log_ratio, mask


def test_hand_values_and_gradient():
    log_ratio, mask = hand_fixture()
    ctx, logps = make_ctx(log_ratio, ADV, mask, GROUP_IDS)
    per_token = gvpo_surrogate(ctx, gvpo_beta=0.5)
    assert per_token.shape == (8, 3)
    expected_rows = torch.tensor([0.5 * c * c * 4 / 3 for c in C_MINUS_A], dtype=torch.float64)
    torch.testing.assert_close(per_token, expected_rows.unsqueeze(1).expand(8, 3))
    loss = aggregate(per_token, ctx.mask, "sequence_mean")
    torch.testing.assert_close(loss, torch.tensor(1 / 3, dtype=torch.float64))
    loss.backward()
    expected_grad = torch.tensor(C_MINUS_A, dtype=torch.float64).unsqueeze(1) / 12 * mask
    torch.testing.assert_close(logps.grad, expected_grad)


def test_matches_official_formula():
    # one group in the micro-batch: our loss IS the official loss (value and gradient);
    # k groups: the official loss sums over them, ours averages → official = k · ours.
    log_ratio, mask = hand_fixture()
    adv = torch.tensor(ADV, dtype=torch.float64).unsqueeze(1).expand(8, 3)
    ids = torch.tensor(GROUP_IDS)
    torch.testing.assert_close(official_loss(log_ratio, adv, mask, ids, 0.5, 4), torch.tensor(2 / 3, dtype=torch.float64))
    torch.manual_seed(0)
    for n_groups in (1, 3):
        n, t, beta = 4, 5, 0.1
        b = n * n_groups
        log_ratio = 0.3 * torch.randn(b, t, dtype=torch.float64)
        mask = (torch.rand(b, t) > 0.3).double()
        mask[:, 0] = 1
        rewards = torch.randint(0, 2, (b,)).double()
        ids = torch.randperm(b) % n_groups  # shuffled rows
        means = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, ids, rewards) / n
        adv = (rewards - means[ids]).unsqueeze(1).expand(b, t)
        ctx, logps = make_ctx(log_ratio, adv[:, :1], mask, ids)
        ours = gvpo_loss(ctx, beta)
        ours.backward()
        ref_ratio = log_ratio.clone().requires_grad_()
        ref = official_loss(ref_ratio, adv, mask, ids, beta, n)
        ref.backward()
        torch.testing.assert_close(ours * n_groups, ref)
        torch.testing.assert_close(logps.grad * n_groups, ref_ratio.grad * mask)


def test_gradient_is_analytic_and_equals_undetached_paper_loss_for_centred_advantages():
    # ∂L/∂logp_it = β((rθ_i − m_g) − Â_i) · n/(n−1) · m_it / B with m_g detached; for centred Â the paper's
    # undetached group mean gives the same gradient.
    torch.manual_seed(1)
    n, groups, t, beta = 4, 2, 6, 0.1
    b = n * groups
    log_ratio = 0.2 * torch.randn(b, t, dtype=torch.float64)
    mask = (torch.rand(b, t) > 0.25).double()
    mask[:, 0] = 1
    ids = torch.tensor([1, 0, 0, 1, 1, 0, 1, 0])
    rewards = torch.rand(b, dtype=torch.float64)
    means = torch.zeros(groups, dtype=torch.float64).index_add_(0, ids, rewards) / n
    adv = rewards - means[ids]
    ctx, logps = make_ctx(log_ratio, adv, mask, ids)
    gvpo_loss(ctx, beta).backward()
    r_theta = beta * (log_ratio * mask).sum(-1)
    m = (torch.zeros(groups, dtype=torch.float64).index_add_(0, ids, r_theta) / n)[ids]
    expected = (beta * ((r_theta - m) - adv) * n / (n - 1) / b).unsqueeze(1) * mask
    torch.testing.assert_close(logps.grad, expected)
    # paper form, group mean not detached, summed per group /(n−1), averaged over groups
    x = log_ratio.clone().requires_grad_()
    r = beta * (x * mask).sum(-1)
    m_live = (torch.zeros(groups, dtype=torch.float64).index_add(0, ids, r) / n)[ids]
    (0.5 * ((r - m_live) - adv) ** 2).sum().div(n - 1).div(groups).backward()
    torch.testing.assert_close(x.grad * mask, expected)


def test_group_size_two():
    # n = 2, β = 1: rθ = [1, 3] → m = 2, c = [-1, 1]; rewards [1, 0] → Â = [.5, -.5]; c − Â = [-1.5, 1.5]
    # ℓ = ½·2.25·n/(n−1)=2 → 2.25 each; loss = mean = 2.25 (= official Σ/(n−1) = 2·1.125/1)
    # gradient: β(c−Â)·2/B = (c−Â)·2/2 = [-1.5, 1.5] on each real token
    ctx, logps = make_ctx([[1.0, 0.0], [1.5, 1.5]], [0.5, -0.5], [[1, 0], [1, 1]], [0, 0])
    loss = gvpo_loss(ctx, 1.0)
    torch.testing.assert_close(loss, torch.tensor(2.25, dtype=torch.float64))
    loss.backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[-1.5, 0.0], [1.5, 1.5]], dtype=torch.float64))


def test_all_equal_rewards():
    # Â = 0: on-policy (log-ratio 0) → loss 0 and gradient 0. Off-policy the implicit rewards are pulled back to their
    # group mean: β = 1, row sums [2, 0, 0, -2] → rθ = [2, 0, 0, -2], m = 0, c = rθ; gradient β·c·(4/3)/B = c/3
    ctx, logps = make_ctx(torch.zeros(4, 2), [0.0] * 4, torch.ones(4, 2), [5] * 4)
    loss = gvpo_loss(ctx, 0.1)
    loss.backward()
    assert loss.item() == 0.0 and (logps.grad == 0).all()
    ctx, logps = make_ctx([[1.0, 1.0], [0.0, 0.0], [0.5, -0.5], [-1.0, -1.0]], [0.0] * 4, torch.ones(4, 2), [5] * 4)
    loss = gvpo_loss(ctx, 1.0)
    # ℓ = ½c²·4/3 = [8/3, 0, 0, 8/3] → mean 4/3
    torch.testing.assert_close(loss, torch.tensor(4 / 3, dtype=torch.float64))
    loss.backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[2 / 3] * 2, [0.0] * 2, [0.0] * 2, [-2 / 3] * 2],
                                                        dtype=torch.float64))


def test_empty_completion_is_out_of_the_group_mean_and_the_loss():
    # group of 4, row 2 has no loss token (empty / filtered / masked truncated). β = 1.
    # active rθ = [3, 1, -, -1] → m = 1 over the 3 active rows; Â = [1, 0, 5 (ignored), -1]; c − Â = [1, 0, -, -1]
    # ℓ = ½(c−Â)²·4/3 = [2/3, 0, 0, 2/3] → loss = (4/3)/4 = 1/3; grad = (c−Â)·(4/3)/4 = [1/3, 0, 0, -1/3]
    mask = torch.tensor([[1, 1], [1, 0], [0, 0], [1, 0]])
    ctx, logps = make_ctx([[1.5, 1.5], [1.0, 9.0], [float("nan"), float("inf")], [-1.0, 9.0]], [1.0, 0.0, 5.0, -1.0],
                          mask, [0, 0, 0, 0])
    per_token = gvpo_surrogate(ctx, gvpo_beta=1.0)
    assert torch.isfinite(per_token).all() and (per_token[2] == 0).all()
    loss = aggregate(per_token, ctx.mask, "sequence_mean")
    torch.testing.assert_close(loss, torch.tensor(1 / 3, dtype=torch.float64))
    loss.backward()
    expected = torch.tensor([[1 / 3, 1 / 3], [0.0, 0.0], [0.0, 0.0], [-1 / 3, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(logps.grad, expected)


def test_padding_never_read():
    log_ratio, mask = hand_fixture()
    dirty = log_ratio.clone()
    dirty[mask == 0] = float("nan")
    old = torch.full((8, 3), -1.0, dtype=torch.float64)
    old[mask == 0] = -float("inf")
    ctx_a, logps_a = make_ctx(log_ratio, ADV, mask, GROUP_IDS)
    ctx_b, logps_b = make_ctx(dirty, ADV, mask, GROUP_IDS, old=old)
    la, lb = gvpo_loss(ctx_a, 0.5), gvpo_loss(ctx_b, 0.5)
    torch.testing.assert_close(la, lb)
    la.backward()
    lb.backward()
    torch.testing.assert_close(logps_a.grad, logps_b.grad)
    assert (logps_b.grad[mask == 0] == 0).all()


def test_token_level_advantages_are_mask_averaged():
    # official l.42: Â_i = Σ_t A_it m_it / Σ_t m_it. Per-token [1, 3, pad 99] → 2, same as a sequence advantage 2.
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    seq, _ = make_ctx(torch.zeros(2, 3), [2.0, -2.0], mask, [0, 0])
    tok, _ = make_ctx(torch.zeros(2, 3), torch.tensor([[1.0, 3.0, 99.0], [-2.0, -2.0, -2.0]]), mask, [0, 0])
    torch.testing.assert_close(gvpo_surrogate(seq, gvpo_beta=0.1), gvpo_surrogate(tok, gvpo_beta=0.1))


def test_singleton_groups_give_zero():
    # num_generations_eval = 1: 1/(n−1) undefined, the centred reward is 0 → loss 0, gradient 0
    ctx, logps = make_ctx([[0.3], [-0.2]], [0.0, 0.0], torch.ones(2, 1), [0, 1])
    loss = gvpo_loss(ctx, 0.1)
    loss.backward()
    assert loss.item() == 0.0 and (logps.grad == 0).all()


def test_catalog_checks_centred_match_and_reward_shift():
    # loss 0 (and gradient 0) when the centred β·log-ratio equals the centred rewards
    beta, rewards = 0.5, torch.tensor([1.0, 0.0, 0.25, 0.75], dtype=torch.float64)
    centred = rewards - rewards.mean()
    log_ratio = (centred / beta + 3.0).unsqueeze(1)  # + a constant: the group mean removes it
    ctx, logps = make_ctx(log_ratio, centred, torch.ones(4, 1), [0] * 4)
    loss = gvpo_loss(ctx, beta)
    loss.backward()
    assert loss.item() == pytest.approx(0.0, abs=1e-24)
    torch.testing.assert_close(logps.grad, torch.zeros(4, 1, dtype=torch.float64))
    # adding a constant to every reward of a group leaves Â = R − mean(R), hence loss and gradient, unchanged
    log_ratio = torch.tensor([[0.3], [-0.1], [0.2], [0.0]], dtype=torch.float64)
    out = []
    for shift in (0.0, 7.0):
        r = rewards + shift
        ctx, logps = make_ctx(log_ratio, r - r.mean(), torch.ones(4, 1), [0] * 4)
        loss = gvpo_loss(ctx, beta)
        loss.backward()
        out.append((loss.detach(), logps.grad))
    torch.testing.assert_close(out[0][0], out[1][0])
    torch.testing.assert_close(out[0][1], out[1][1])


def test_split_into_whole_groups_does_not_change_the_loss():
    # two groups in one micro-batch == each group in its own micro-batch, averaged (gradient accumulation over 2)
    log_ratio, mask = hand_fixture()
    ctx, logps = make_ctx(log_ratio, ADV, mask, GROUP_IDS)
    whole = gvpo_loss(ctx, 0.5)
    whole.backward()
    ids = torch.tensor(GROUP_IDS)
    parts, grad = 0.0, torch.zeros(8, 3, dtype=torch.float64)
    for gid in (7, 3):
        rows = ids == gid
        sub, sub_logps = make_ctx(log_ratio[rows], torch.tensor(ADV)[rows], mask[rows], ids[rows])
        part = gvpo_loss(sub, 0.5) / 2
        part.backward()
        parts = parts + part.detach()
        grad[rows] = sub_logps.grad
    torch.testing.assert_close(whole.detach(), parts)
    torch.testing.assert_close(logps.grad, grad)


def test_errors():
    ctx, _ = make_ctx(torch.zeros(3, 1), [0.0] * 3, torch.ones(3, 1), [0, 0, 1])
    with pytest.raises(ValueError, match="whole prompt groups.*steps_per_generation=1"):
        gvpo_surrogate(ctx, gvpo_beta=0.1)  # a group cut by the micro-batch split
    ctx, _ = make_ctx(torch.zeros(2, 1), [0.0] * 2, torch.ones(2, 1), [0, 0])
    with pytest.raises(ValueError, match="group_structure"):
        gvpo_surrogate(ObjectiveContext(ctx.logps, ctx.old_logps, ctx.advantages, ctx.mask), gvpo_beta=0.1)
    for bad in (float("inf"), float("nan")):  # a ±inf reward reaching the advantages
        ctx, _ = make_ctx(torch.zeros(2, 1), [bad, 0.0], torch.ones(2, 1), [0, 0])
        with pytest.raises(ValueError, match="non-finite advantages.*reward_funcs"):
            gvpo_surrogate(ctx, gvpo_beta=0.1)


COMMON = {"output_dir": "/tmp/unused", "use_cpu": True, "bf16": False}


def test_flags_and_validation():
    variant = get_variant("gvpo")
    assert variant.flags["gvpo_beta"] == 0.1 and variant.flags["scale_rewards"] == "none"
    assert variant.flags["num_generations"] == 4 and variant.requires == ("group_structure",)
    GRPOConfig(**COMMON, **variant.flags)
    GRPOConfig(**COMMON, **{**variant.flags, "gradient_accumulation_steps": 4})  # steps_per_generation stays 1
    gvpo = {"loss_type": "gvpo", "scale_rewards": "none", "num_generations": 4}
    with pytest.raises(ValueError, match="gvpo_beta"):
        GRPOConfig(**COMMON, **gvpo, gvpo_beta=0.0)
    with pytest.raises(ValueError, match="gvpo_beta"):
        GRPOConfig(**COMMON, **gvpo, gvpo_beta=math.inf)
    with pytest.raises(ValueError, match="scale_rewards='none'"):
        GRPOConfig(**COMMON, loss_type="gvpo", num_generations=4)
    with pytest.raises(ValueError, match="loss_aggregation"):
        GRPOConfig(**COMMON, **gvpo, loss_aggregation="token_mean")
    with pytest.raises(ValueError, match="steps_per_generation=1"):  # TRL's default = gradient_accumulation_steps
        GRPOConfig(**COMMON, **gvpo, gradient_accumulation_steps=2)
    with pytest.raises(ValueError, match="steps_per_generation=1"):
        GRPOConfig(**COMMON, **gvpo, steps_per_generation=2)
    # one process: TRL already needs the generation batch (= per-device batch when steps_per_generation=1) to hold
    # whole groups; with several processes only the global one must, so the hook checks the per-device batch
    validate = variant.validate
    base = vars(GRPOConfig(**COMMON, **gvpo))
    with pytest.raises(ValueError, match="per_device_train_batch_size=6 must be a multiple of num_generations=4"):
        validate(SimpleNamespace(**{**base, "per_device_train_batch_size": 6}))
    with pytest.raises(ValueError, match="per_device_eval_batch_size=6.*num_generations_eval.*=4"):
        validate(SimpleNamespace(**{**base, "eval_strategy": "steps", "per_device_eval_batch_size": 6}))
    with pytest.raises(ValueError, match="per_device_eval_batch_size=4.*num_generations_eval.*=8"):
        validate(SimpleNamespace(**{**base, "eval_strategy": "steps", "per_device_eval_batch_size": 4,
                                    "num_generations_eval": 8}))
    validate(SimpleNamespace(**{**base, "per_device_eval_batch_size": 6}))  # no eval: not checked
    GRPOConfig(**COMMON, **gvpo, eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=8)
    # another advantage estimator is used as is (its own scale convention)
    GRPOConfig(**COMMON, loss_type="gvpo", num_generations=4, advantage_estimator="rloo")
    with pytest.raises(ValueError, match="gvpo_beta=0.2 belongs to variant 'gvpo'"):
        GRPOConfig(**COMMON, gvpo_beta=0.2)
