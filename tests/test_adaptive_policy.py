"""The adaptive speculation policy's choice from given step costs and acceptance profiles."""

from __future__ import annotations

import pytest

from hotspec.core.spec_shape import OFF, SpecShape
from hotspec.speculative.adaptive import AcceptanceProfile, AdaptivePolicy, StepCosts

CHAIN3, CHAIN5 = SpecShape.parse("3/1/4"), SpecShape.parse("5/1/6")
TREE = SpecShape.parse("4/8/12")


def test_parse_shapes_and_errors():
    assert SpecShape.parse("off") is OFF and OFF.label == "off"
    assert SpecShape.parse("4/8/12") == SpecShape(4, 8, 12) and TREE.label == "4/8/12"
    for bad, msg in [("3-1-4", "STEPS/TOPK/TOKENS"), ("3/1/5", "verifies 4 tokens"),
                     ("2/2/9", "at most 6 drafted nodes"), ("0/1/1", ">= 1")]:
        with pytest.raises(ValueError, match=msg):
            SpecShape.parse(bad)


def _costs(table: dict[SpecShape, dict[int, float]], real: bool = True) -> StepCosts:
    """Step costs as given (`real`: as if each had run in the loop, not only been replayed)."""
    costs = StepCosts([1, 8, 32])
    for shape, per_bs in table.items():
        for bs, ms in per_bs.items():
            costs.seed(shape, bs, ms)
            if real:
                costs.real.add((shape, costs.bucket(bs)))
    return costs


def _profile(shape: SpecShape, accept_lens: list[int], steps: int = 200) -> AcceptanceProfile:
    p = AcceptanceProfile(half_life=1e9, prior=0.5)
    for _ in range(steps):
        p.update(shape, accept_lens)
    return p


def test_chain_profile_serves_every_chain_length():
    """Conditional rates measured with a 3-deep chain predict a 5-deep one (the deepest rate
    standing in for depths 4 and 5); expected tokens = 1 + sum of the products."""
    # per 4 requests: accepted 0, 1, 2, 3 drafts -> depth 1: 3/4, depth 2: 2/3, depth 3: 1/2
    p = _profile(CHAIN3, [0, 1, 2, 3])
    r3 = p.rates(CHAIN3)
    assert r3 == pytest.approx([3 / 4, 2 / 3, 1 / 2], abs=2e-3)
    assert p.rates(CHAIN5) == pytest.approx(r3 + [r3[-1]] * 2, abs=2e-3)
    assert p.expected_tokens(CHAIN3) == pytest.approx(1 + 0.75 + 0.5 + 0.25, abs=5e-3)
    assert p.expected_tokens(OFF) == 1.0
    # trees have a table of their own: nothing measured yet -> the prior
    assert p.rates(TREE) == [0.5] * 4


def test_trees_of_one_topk_share_a_profile():
    """What a 4-deep tree of topk 8 measured predicts a 6-deep one (its deepest rate standing in
    for depths 5 and 6), so the deeper tree is weighed on the traffic's acceptance from the first
    step; a tree of another topk, and the chains, keep their own tables."""
    p = _profile(TREE, [1, 2, 3, 4])
    r4 = p.rates(TREE)
    assert r4 == pytest.approx([1.0, 3 / 4, 2 / 3, 1 / 2], abs=5e-3)
    assert p.rates(SpecShape.parse("6/8/16")) == pytest.approx(r4 + [r4[-1]] * 2, abs=5e-3)
    assert p.rates(SpecShape.parse("3/4/8")) == [0.5] * 3
    assert p.rates(CHAIN3) == [0.5] * 3


def test_policy_turns_speculation_off_where_it_loses_and_on_where_it_pays():
    """Batch 1: a step of 2x decode committing 2.5 tokens wins; batch 32: 2.5 tokens at 3x a
    decode step loses to plain decode."""
    costs = _costs({OFF: {1: 1.0, 32: 1.0}, CHAIN3: {1: 2.0, 32: 3.0}})
    policy = AdaptivePolicy([OFF, CHAIN3], costs, _profile(CHAIN3, [0, 1, 2, 3]), probe_every=0)
    c1 = policy.choose(1)
    assert c1.shape == CHAIN3 and c1.tokens_per_s["3/1/4"] == pytest.approx(1e3 * 2.5 / 2.0, rel=1e-2)
    assert policy.choose(20).shape == OFF  # 20 runs in the graph of 32
    assert policy.chosen == {1: "3/1/4", 32: "off"}


def test_policy_prefers_the_tree_when_its_acceptance_pays_for_its_cost():
    costs = _costs({OFF: {8: 1.0}, CHAIN3: {8: 1.5}, TREE: {8: 2.0}})
    profile = _profile(CHAIN3, [0, 1, 1, 2])  # chain: E ~ 2.0 -> 1333 tok/s per request-ms
    for _ in range(200):
        profile.update(TREE, [3, 4, 2, 4])  # tree: E ~ 4.25 -> 2125
    policy = AdaptivePolicy([OFF, CHAIN3, TREE], costs, profile, probe_every=0)
    assert policy.choose(8).shape == TREE


def test_policy_follows_drifting_traffic():
    """Well-accepted traffic, then traffic that accepts nothing: the decayed profile turns
    speculation off within a few half-lives; a step whose time is not measured leaves the costs."""
    costs = _costs({OFF: {1: 1.0}, CHAIN3: {1: 1.6}})
    policy = AdaptivePolicy([OFF, CHAIN3], costs, AcceptanceProfile(half_life=16), probe_every=0)
    for _ in range(100):
        assert policy.choose(1).shape == CHAIN3
        policy.observe(CHAIN3, 1, 1.6, [3])
    steps = 0
    while policy.choose(1).shape == CHAIN3:
        policy.observe(CHAIN3, 1, 1.6, [0])
        steps += 1
        assert steps < 100
    assert 5 <= steps <= 60
    policy.observe(OFF, 1, 1.0, [])
    assert costs.cost(OFF, 1) == pytest.approx(1.0) and costs.cost(CHAIN3, 1) == pytest.approx(1.6)
    policy.observe(OFF, 1, None, [])  # a step whose time is not measured leaves the cost
    assert costs.cost(OFF, 1) == pytest.approx(1.0)
    # while off, what was measured fades toward the prior: speculation is tried again
    off_steps = 0
    while policy.choose(1).shape == OFF:
        policy.observe(OFF, 1, 1.0, [])
        off_steps += 1
        assert off_steps < 400
    assert off_steps > 16


def test_step_costs_follow_a_drift_common_to_every_shape():
    """Contexts grow, every shape's step with them, but only the running shape is measured: the
    ones not running move with it (the bucket's level), so a shape measured when contexts were
    short does not look cheap against one measured now, and the choice stays the same."""
    chain2 = SpecShape.parse("2/1/3")
    costs = _costs({OFF: {1: 40.0}, chain2: {1: 55.0}, CHAIN3: {1: 72.0}})
    profile = _profile(CHAIN3, [0, 1, 1, 2])  # ~45 % at each depth: the short chain wins
    policy = AdaptivePolicy([OFF, chain2, CHAIN3], costs, profile, probe_every=0)
    assert policy.choose(1).shape == chain2
    for ms in range(55, 111):  # chain2's step doubles as the context grows
        policy.observe(chain2, 1, float(ms), [1])
    c2, c3, off = costs.cost(chain2, 1), costs.cost(CHAIN3, 1), costs.cost(OFF, 1)
    assert c2 is not None and c3 is not None and off is not None
    assert c2 == pytest.approx(110.0, rel=0.05)
    assert c3 / c2 == pytest.approx(72 / 55, rel=0.05) and off / c2 == pytest.approx(40 / 55, rel=0.05)
    assert policy.choose(1).shape == chain2
    assert {(s.label, b) for s, b in costs.ms} == {("off", 1), ("2/1/3", 1), ("3/1/4", 1)}


def test_step_costs_learn_relative_costs_from_switches():
    """A shape seeded too cheap (1.2x plain decode where it costs 2x) is corrected by its steps
    that follow another shape's; its own steps in a row move the level, not its ratio."""
    costs = _costs({OFF: {1: 1.0}, CHAIN3: {1: 1.2}})
    for _ in range(20):
        for _ in range(3):
            costs.observe(OFF, 1, 1.0)
        costs.observe(CHAIN3, 1, 2.0)
    c3, off = costs.cost(CHAIN3, 1), costs.cost(OFF, 1)
    assert c3 is not None and off is not None and c3 / off == pytest.approx(2.0, rel=0.05)
    ratio = costs.ratio[(CHAIN3, 1)]
    for _ in range(10):
        costs.observe(CHAIN3, 1, 2.4)  # a longer context: the level rises, the ratio stays
    assert costs.ratio[(CHAIN3, 1)] == ratio and costs.cost(CHAIN3, 1) == pytest.approx(2.4, rel=0.1)


def test_probes_run_each_other_speculative_shape_in_turn():
    """Every `probe_every` steps the speculative shape run longest ago runs once, so every
    shape's cost is re-measured in turn (not the runner-up alone, whose estimate a single noisy
    step may have spoilt); plain decode, though second here, is never probed (its estimate needs
    no acceptance, and the draft would have to catch up after it)."""
    chain2 = SpecShape.parse("2/1/3")
    costs = _costs({OFF: {1: 1.0}, chain2: {1: 4.0}, CHAIN3: {1: 1.2}, CHAIN5: {1: 5.0}})
    policy = AdaptivePolicy([OFF, chain2, CHAIN3, CHAIN5], costs, _profile(CHAIN3, [3]),
                            probe_every=4, decide_every=1)
    picks = []
    for _ in range(16):
        c = policy.choose(1)
        picks.append(c)
        policy.observe(c.shape, 1, None, [])
    assert picks[0].tokens_per_s["off"] > picks[0].tokens_per_s["2/1/3"]
    assert [c.probe for c in picks] == [False, False, False, True] * 4
    assert [c.shape for c in picks if c.probe] == [CHAIN5, chain2] * 2  # (the likelier first)
    assert {c.shape for c in picks if not c.probe} == {CHAIN3}


def test_a_shapes_first_loop_samples_are_averaged():
    """One step's time is noisy: a shape's first step in the loop, 1.6x its cost, is averaged
    with the next ones rather than trusted alone or decayed away slowly."""
    costs = _costs({CHAIN3: {1: 1.0}, CHAIN5: {1: 1.5}}, real=False)
    costs.observe(CHAIN3, 1, 1.0)
    for ms in (3.2, 2.0, 2.0, 2.0):  # the 5-chain costs 2x the 3-chain; its first step, 3.2x
        costs.observe(CHAIN5, 1, ms)
        costs.observe(CHAIN3, 1, 1.0)
    c3, c5 = costs.cost(CHAIN3, 1), costs.cost(CHAIN5, 1)
    assert c3 is not None and c5 is not None and c5 / c3 == pytest.approx(2.3, rel=0.06)


def test_unmeasured_shapes_run_first_and_buckets():
    """A candidate without a cost at a batch size is run (probed) before any estimate is
    trusted; a batch past the largest captured size counts as the largest."""
    costs = StepCosts([1, 8])
    assert costs.bucket(3) == 8 and costs.bucket(9) == 8
    policy = AdaptivePolicy([OFF, CHAIN3], costs, _profile(CHAIN3, [3]), probe_every=0)
    first = policy.choose(1)
    assert first.probe and first.shape == OFF
    policy.observe(OFF, 1, 1.0, [])
    assert policy.choose(1).shape == CHAIN3 and policy.choose(1).probe
    policy.observe(CHAIN3, 1, 1.5, [3])
    assert policy.choose(1).shape == CHAIN3 and not policy.choose(1).probe
    with pytest.raises(ValueError, match="at least one candidate"):
        AdaptivePolicy([], costs)


def test_speculative_metrics_report_counters_and_the_chosen_shapes():
    """/metrics of a speculative engine: draft and accepted token counters, acceptance per
    position, steps per shape, and the adaptive policy's choice per batch size."""

    from prometheus_client import CollectorRegistry, generate_latest

    from hotspec.core.spec_stats import SpecStats
    from hotspec.entrypoints.metrics import _SpecMetrics

    stats = SpecStats()
    stats.accept_hist.update({1: 3, 2: 2, 4: 1})  # 6 passes, accepted 0+0+0+1+1+3 = 5
    stats.drafted = 18
    stats.shape_steps.update({"3/1/4": 6, "off": 4})
    policy = AdaptivePolicy([OFF, CHAIN3], StepCosts([1, 8]))
    policy.chosen = {1: "3/1/4", 8: "off"}
    reg = CollectorRegistry()
    m = _SpecMetrics(reg)
    m.update(stats, policy.chosen)
    m.update(stats, policy.chosen)  # counters advance by what is new only
    text = generate_latest(reg).decode()
    assert "hotspec_spec_draft_tokens_total 18.0" in text
    assert "hotspec_spec_accepted_tokens_total 5.0" in text
    assert 'hotspec_spec_accepted_tokens_per_pos_total{position="0"} 3.0' in text
    assert 'hotspec_spec_accepted_tokens_per_pos_total{position="2"} 1.0' in text
    assert 'hotspec_spec_steps_total{shape="off"} 4.0' in text
    assert 'hotspec_spec_shape_chosen{batch_size="8",shape="off"} 1.0' in text


def test_each_request_accepts_on_top_of_the_batch():
    """A request's own verifies move its estimate off the batch's within a few steps; a new
    request starts from the batch's; the tables of requests gone are dropped."""
    p = AcceptanceProfile(half_life=1e9, request_half_life=1e9, request_weight=4.0)
    for _ in range(50):
        p.update(CHAIN3, [3, 0], rids=[1, 2])  # request 1 accepts everything, request 2 nothing
    batch = p.expected_tokens(CHAIN3)
    good, bad = p.expected_tokens(CHAIN3, [1]), p.expected_tokens(CHAIN3, [2])
    assert bad < 1.2 < batch < good and good > 3.8
    assert p.expected_tokens(CHAIN3, [3]) == pytest.approx(batch)  # new: the batch's
    assert p.expected_tokens(CHAIN3, [1, 2]) == pytest.approx((good + bad) / 2)
    many = [1, 2] + list(range(10, 10 + AcceptanceProfile.PER_REQUEST_MAX))
    assert p.expected_tokens(CHAIN3, many) == pytest.approx(batch)  # a large batch: the batch's
    # at batch 1 a prompt that accepts nothing turns speculation off, the next one turns it on
    costs = _costs({OFF: {1: 1.0}, CHAIN3: {1: 1.5}})
    policy = AdaptivePolicy([OFF, CHAIN3], costs, p, probe_every=0)
    assert policy.choose(1, [2]).shape == OFF
    assert policy.choose(1, [5]).shape == CHAIN3
    assert set(p.requests) == set()  # (request 2 is gone: its table too)


def test_plain_decode_pays_for_the_draft_catching_up():
    """Returning from plain decode costs a catch-up pass (C ms), paid every `catch_up_every`
    plain steps too: off is charged C / catch_up_every a step, and a speculating batch turns off
    only when the gain over that many steps outweighs one catch-up."""
    costs = _costs({OFF: {32: 1.0}, CHAIN3: {32: 2.2}})  # 2.5 tokens at 2.2 ms: 1136 vs 1000
    costs_b = _costs({OFF: {32: 1.0}, CHAIN3: {32: 2.7}})  # 926 vs 1000: off 8 % ahead
    for c, off_wins_without in ((costs, False), (costs_b, True)):
        free = AdaptivePolicy([OFF, CHAIN3], c, _profile(CHAIN3, [0, 1, 2, 3]), probe_every=0)
        assert (free.choose(32).shape == OFF) == off_wins_without
    # a catch-up of 16 ms: off costs 1 + 16/64 ms a step (800 tok/s/row), below the chain
    policy = AdaptivePolicy([OFF, CHAIN3], costs_b, _profile(CHAIN3, [0, 1, 2, 3]), probe_every=0)
    policy.observe_catch_up(32, 16.0)
    c = policy.choose(32)
    assert c.shape == CHAIN3 and c.tokens_per_s["off"] == pytest.approx(32e3 / 1.25, rel=1e-3)
    # a catch-up of 4 ms: off is 1000 / 1.0625 = 941 against 926 (1.6 % ahead), inside the
    # margin for leaving the chain (4 / 64 = 6 %); at 3x the chain's cost it is far ahead
    policy = AdaptivePolicy([OFF, CHAIN3], costs_b, _profile(CHAIN3, [0, 1, 2, 3]), probe_every=0)
    policy.observe_catch_up(32, 4.0)
    assert policy.choose(32).shape == CHAIN3
    slow = _costs({OFF: {32: 1.0}, CHAIN3: {32: 4.0}})
    policy = AdaptivePolicy([OFF, CHAIN3], slow, _profile(CHAIN3, [0, 1, 2, 3]), probe_every=0)
    policy.observe_catch_up(32, 4.0)
    assert policy.choose(32).shape == OFF and policy.choose(32).shape == OFF


def test_noisy_step_times_do_not_flip_the_choice():
    """Two chains within noise of each other (step times measured with +-10 % noise, acceptance
    drawn at random): the policy settles and switches rarely, probes aside, and never leaves for
    plain decode, which is 30 % behind."""
    import random

    rng = random.Random(0)
    costs = _costs({OFF: {8: 1.0}, CHAIN3: {8: 1.6}, CHAIN5: {8: 2.1}})
    policy = AdaptivePolicy([OFF, CHAIN3, CHAIN5], costs, AcceptanceProfile(), probe_every=64)
    true_ms = {OFF: 1.0, CHAIN3: 1.6, CHAIN5: 2.1}
    last, switches, off = None, 0, 0
    for _ in range(2000):
        c = policy.choose(8, list(range(8)))
        if not c.probe:
            switches += last is not None and c.shape != last
            last = c.shape
        off += c.shape.off
        lens = [sum(1 for _ in range(c.shape.num_steps)
                    if rng.random() < 0.7) for _ in range(8)] if not c.shape.off else [0] * 8
        policy.observe(c.shape, 8, true_ms[c.shape] * rng.uniform(0.9, 1.1), lens, list(range(8)))
    assert switches <= 20, switches
    assert off <= 2  # (its first measurement at most)


def test_decides_every_n_steps_and_when_a_small_batchs_requests_change():
    costs = _costs({OFF: {1: 1.0}, CHAIN3: {1: 1.5}})
    p = _profile(CHAIN3, [3])
    policy = AdaptivePolicy([OFF, CHAIN3], costs, p, probe_every=0, decide_every=8)
    first = policy.choose(1, [1])
    assert first.tokens_per_s  # a decision: every candidate estimated
    between = [policy.choose(1, [1]) for _ in range(7)]
    assert all(c.shape == first.shape and not c.tokens_per_s for c in between)
    assert policy.choose(1, [1]).tokens_per_s  # the 9th step decides anew
    assert policy.choose(1, [2]).tokens_per_s  # a new request: at once
    single = AdaptivePolicy([CHAIN3], costs, p)
    assert all(single.choose(1, [i]).shape == CHAIN3 for i in range(3))
    assert single.chosen == {1: "3/1/4"}


def test_replayed_costs_give_way_to_the_loops_first_steps():
    """Replays time the graphs alone: the 5-deep chain 2x the 3-deep one. In the loop both cost
    the host's 1.5-2 ms more (launch-bound), so the deeper chain, which commits more, is faster.
    Each shape runs once at the bucket before the ranking is trusted, and its first step
    replaces its replayed ratio: the policy then picks the deeper chain."""
    costs = _costs({CHAIN3: {1: 1.0}, CHAIN5: {1: 2.0}}, real=False)
    loop = {CHAIN3: 3.0, CHAIN5: 3.5}
    profile = _profile(CHAIN5, [5, 5, 4, 3])  # E: 5.25 tokens a step of the 5-chain, 4 of the 3
    policy = AdaptivePolicy([CHAIN3, CHAIN5], costs, profile, probe_every=0)
    assert policy.estimates(1)[CHAIN3] > policy.estimates(1)[CHAIN5]  # the replays' view
    ran = []
    for _ in range(4):
        c = policy.choose(1)
        ran.append((c.shape.label, c.probe))
        policy.observe(c.shape, 1, loop[c.shape], [c.shape.num_steps] * 4)
    assert ran[:2] == [("3/1/4", True), ("5/1/6", True)]  # each once, first
    assert ran[2:] == [("5/1/6", False)] * 2
    assert costs.cost(CHAIN5, 1) / costs.cost(CHAIN3, 1) == pytest.approx(3.5 / 3)


def test_a_shapes_loop_cost_carries_to_buckets_it_has_not_run_at():
    """Each shape runs once (at the first bucket it meets), not once at every bucket: at another
    bucket its cost is the loop's ratio where it ran, scaled by how its replays change between
    the two buckets, until it runs there too (then that step's own ratio)."""
    costs = StepCosts([1, 8])
    for bs, (r3, r5) in {1: (1.0, 2.0), 8: (2.0, 3.0)}.items():  # replays: 5-chain 2x, then 1.5x
        costs.seed(CHAIN3, bs, r3)
        costs.seed(CHAIN5, bs, r5)
    profile = _profile(CHAIN5, [5, 5, 4, 3])
    policy = AdaptivePolicy([CHAIN3, CHAIN5], costs, profile, probe_every=0)
    for _ in range(2):  # at batch 1 each runs once: in the loop the 5-chain costs 1.2x, not 2x
        c = policy.choose(1)
        assert c.probe
        policy.observe(c.shape, 1, {CHAIN3: 3.0, CHAIN5: 3.6}[c.shape], [4])
    assert costs.cost(CHAIN5, 1) / costs.cost(CHAIN3, 1) == pytest.approx(1.2)
    # batch 8: no shape runs first; the ratio carried is 1.2 * (1.5 / 2) = 0.9 of the 3-chain's
    c = policy.choose(8)
    assert not c.probe and c.shape == CHAIN5
    assert costs.cost(CHAIN5, 8) / costs.cost(CHAIN3, 8) == pytest.approx(1.2 * (3.0 / 2.0) / (2.0 / 1.0))
    policy.observe(CHAIN5, 8, 4.0, [4])  # its first step at batch 8 replaces the carried ratio
    assert (CHAIN5, 8) in costs.real and costs.ratio[(CHAIN5, 8)] == pytest.approx(4.0 / 2.0)


def test_a_busy_bucket_measures_the_shapes_it_only_carried():
    """A carried cost is a guess: at batch 8 the 3-chain's is carried from batch 1 and wrong
    (the replays say 2x, the loop finds it as cheap as at batch 1, and the 5-chain dearer). The
    bucket's first decision
    runs the 5-chain on the guess; its second runs the 3-chain once, which then wins on its
    measured cost. A bucket decided once (a batch passing through) probes nothing."""
    costs = StepCosts([1, 8])
    for bs, (r3, r5) in {1: (1.0, 1.2), 8: (2.0, 1.2)}.items():
        costs.seed(CHAIN3, bs, r3)
        costs.seed(CHAIN5, bs, r5)
    profile = _profile(CHAIN5, [5, 5, 4, 3])
    policy = AdaptivePolicy([CHAIN3, CHAIN5], costs, profile, probe_every=0, decide_every=4)
    loop = {1: {CHAIN3: 3.0, CHAIN5: 3.6}, 8: {CHAIN3: 3.0, CHAIN5: 4.5}}
    for _ in range(2):  # each runs once, at batch 1
        c = policy.choose(1)
        policy.observe(c.shape, 1, loop[1][c.shape], [4])
    ran = []
    for _ in range(12):
        c = policy.choose(8)
        ran.append((c.shape, c.probe))
        policy.observe(c.shape, 8, loop[8][c.shape], [4] * 8)
    assert ran[0] == (CHAIN5, False) and ran[:4] == [(CHAIN5, False)] * 4  # the carried guess
    assert ran[4] == (CHAIN3, True)  # the second decision: the carried shape, measured once
    assert (CHAIN3, 8) in costs.real and ran[8:] == [(CHAIN3, False)] * 4
