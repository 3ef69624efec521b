"""The adaptive speculation policy: before each step, the shape (or plain decode) with the most
expected tokens per second for the running batch.

    expected tokens/s of shape s at batch b = b * E[tokens a request commits per step | s] / t(s, b)

E[tokens | s] comes from the acceptance profile measured online from verify results: the batch's,
and each request's own on top of it (the mean over the batch's requests). For chains
(topk 1) the conditional acceptance at draft depth d (accepted at d, given d was reached) does not
depend on how deep the chain goes, so one profile serves every chain length:
E = 1 + sum_{i<=D} prod_{d<=i} alpha_d, the deepest measured rate standing in beyond what was run.
A tree (topk > 1) accepts more at each depth than a chain (k candidates a level), so the trees
of each topk share a profile of their own, the same way: a deeper tree of that topk is estimated
from what a shallower one measured, rather than from the prior until it happens to be probed.
Counts decay with a half-life in steps (every step's, plain decoding's too), so the profile
follows the traffic and, after a long time off, reverts to the prior and speculation is retried.
t(s, b) is the step time measured at start-up (graph replays at each captured batch size) and
kept current by the steps that run, as a level that every step moves (contexts grow, and every
shape's step with them) times each shape's cost relative to it (StepCosts). Plain decode
("off") commits exactly one token a step.

Each candidate runs once before any is chosen (its first cost, carried to the other batch-size
buckets by StepCosts until it runs there too: a bucket's second decision runs each speculative
shape it only carried, once, so a busy bucket soon ranks on its own costs, while one a served
batch only passes through pays nothing). A shape not run for a while is re-measured:
every `probe_every` steps the speculative shape run longest ago runs for one step, so a profile
that went stale (the traffic drifted) can win back. Plain decode is never probed: its estimate
(one token, the start-up cost ratio) needs no acceptance, and a step of it costs the draft a
catch-up pass on the way back.

That catch-up (an eager draft pass over the tokens plain decode committed, after the steps in
flight are read) is the price of every return from plain decode, and is paid every
`catch_up_every` plain steps while off too. Its time C at each batch-size bucket is measured
(warm-up passes at start-up, then each catch-up), and plain decode is charged for it: its cost
is t(off) + C / catch_up_every, and a batch that speculates turns it off only when the gain over
catch_up_every plain steps outweighs one catch-up, est(off) > est(spec) * (1 + C / (catch_up_every
* t(off))). A batch size keeps its
shape until another is `hysteresis` (3 %) faster: at the boundary of two about equal shapes the
decay would flip the choice every step, and a switch costs a little.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field

from hotspec.core.spec_shape import SpecShape


@dataclass
class _Depths:
    """Decayed counts of verify results: reached[d] and accepted[d] for depth d + 1. Decay is
    lazy: `clock` is the step the counts are decayed to, and `at` brings them to a later one
    (one multiplication for every step since, not one pass a step over every table)."""

    reached: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)
    clock: int = 0

    def at(self, now: int, f: float) -> _Depths:
        if now != self.clock:
            g = f ** (now - self.clock)
            self.reached = [x * g for x in self.reached]
            self.accepted = [x * g for x in self.accepted]
            self.clock = now
        return self

    def add(self, accept_len: int, depth: int, n: float = 1.0) -> None:
        """`n` requests' verifies: `accept_len` drafts accepted of a `depth`-deep draft."""
        while len(self.reached) < depth:
            self.reached.append(0.0)
            self.accepted.append(0.0)
        for d in range(min(accept_len + 1, depth)):
            self.reached[d] += n
            if d < accept_len:
                self.accepted[d] += n

    def rates(self, prior: float) -> list[float]:
        """Conditional acceptance per depth; `prior` where nothing was reached yet."""
        return [(a + prior) / (r + 1.0) for a, r in zip(self.accepted, self.reached)]

    @property
    def weight(self) -> float:
        return self.reached[0] if self.reached else 0.0


class AcceptanceProfile:
    """Acceptance per draft depth, decayed, one table for all chains and one per tree topk; the
    batch's (every request's verifies) and each request's own, which starts from the batch's
    (`request_weight` verifies' worth of it) and soon speaks for itself: a new prompt is expected
    to accept as the traffic does, and one that accepts worse or better is treated so within a
    few steps."""

    # `request_weight`: a Beta prior of about this strength matches the spread of acceptance
    # between prompts against the binomial noise of a few verifies, so a request's first few
    # verifies do not swing the choice between shapes.
    # Batches of more requests use the batch's profile alone: their mean is about it, and the host
    # time of per-request tables grows with the batch, on the step's critical path.
    PER_REQUEST_MAX = 8

    def __init__(self, half_life: float = 64.0, prior: float = 0.5, request_half_life: float = 32.0,
                 request_weight: float = 12.0) -> None:
        self.factor = 0.5 ** (1.0 / half_life)
        self.request_factor = 0.5 ** (1.0 / request_half_life)
        self.prior = prior
        self.request_weight = request_weight
        self.tables: dict[str, _Depths] = {}
        self.requests: dict[int, dict[str, _Depths]] = {}
        self.clock = 0  # steps seen (the batch tables' decay)
        self.request_clock: dict[int, int] = {}  # steps each request was seen in

    @staticmethod
    def _key(shape: SpecShape) -> str:
        return "chain" if shape.chain else f"topk{shape.topk}"

    def update(self, shape: SpecShape, accept_lens: list[int], rids: list[int] | None = None) -> None:
        """One step of `shape`: the accepted drafts of each request of the batch (`rids`: their
        ids, for their own tables). Every step decays every table of the batch and of its
        requests, plain decoding's too: what was measured long ago weighs less than the prior,
        so a shape not run for a while looks as good as the prior says and is tried again."""
        self.clock += 1
        if rids is not None and len(rids) > self.PER_REQUEST_MAX:
            rids = None
        clocks = self.request_clock
        for rid in rids or ():
            clocks[rid] = clocks.get(rid, 0) + 1
        if shape.off:
            return
        key = self._key(shape)
        table = self.tables.setdefault(key, _Depths(clock=self.clock)).at(self.clock, self.factor)
        n = shape.num_steps
        for a, count in Counter(accept_lens).items():
            table.add(a, n, count)
        if rids is None:
            return
        for rid, a in zip(rids, accept_lens):
            own = self.requests.setdefault(rid, {})
            t = own.get(key)
            if t is None:
                t = own[key] = _Depths(clock=clocks[rid])
            t.at(clocks[rid], self.request_factor).add(a, n)

    def keep(self, rids: list[int]) -> None:
        """Only these requests' tables stay (the batch about to run: the others finished)."""
        keep = set(rids)
        if any(r not in keep for r in self.requests):
            self.requests = {r: t for r, t in self.requests.items() if r in keep}
        if any(r not in keep for r in self.request_clock):
            self.request_clock = {r: c for r, c in self.request_clock.items() if r in keep}

    def rates(self, shape: SpecShape, rid: int | None = None) -> list[float]:
        """Conditional acceptance at depths 1..num_steps (the deepest measured rate, or the
        prior, beyond what was measured): the batch's, or request `rid`'s on top of it."""
        table = self.tables.get(self._key(shape))
        r = table.at(self.clock, self.factor).rates(self.prior)[: shape.num_steps] if table else []
        last = r[-1] if r else self.prior
        batch = r + [last] * (shape.num_steps - len(r))
        own = self.requests.get(rid, {}).get(self._key(shape)) if rid is not None else None
        if own is None:
            return batch
        own.at(self.request_clock.get(rid, own.clock), self.request_factor)  # type: ignore[arg-type]
        m = self.request_weight
        return [(a + m * g) / (n + m) if d < len(own.reached) else g
                for d, (g, a, n) in enumerate(zip(batch, own.accepted + [0.0] * len(batch),
                                                  own.reached + [0.0] * len(batch)))]

    def expected_tokens(self, shape: SpecShape, rids: list[int] | None = None) -> float:
        """Tokens a request commits per step, 1 + E[accepted drafts]: the batch's, or the mean
        over the requests `rids` (up to PER_REQUEST_MAX of them)."""
        if shape.off:
            return 1.0
        if not rids or len(rids) > self.PER_REQUEST_MAX:
            return self._expected(self.rates(shape))
        return sum(self._expected(self.rates(shape, r)) for r in rids) / len(rids)

    @staticmethod
    def _expected(rates: list[float]) -> float:
        total, p = 1.0, 1.0
        for a in rates:
            p *= a
            total += p
        return total

    def weight(self, shape: SpecShape) -> float:
        """Decayed count of verifies behind `shape`'s estimate."""
        t = self.tables.get(self._key(shape))
        return t.at(self.clock, self.factor).weight if t is not None else 0.0


class StepCosts:
    """Step time per (shape, captured batch size), as a level times a ratio. A batch runs in the
    graph of the smallest captured size that holds it, so that size's time is its cost.

    Step times drift together: a longer context makes every shape's step slower. Only the shape
    that runs is measured, so absolute times of the others would go stale, and a shape measured
    when contexts were short would look cheap against one measured now. So each batch-size
    bucket keeps a level, which every measured step moves (`level_alpha`), and each shape its
    cost relative to that level, which only a comparison can tell: the start-up replays (all
    shapes at one context) and the first step of a shape after another shape's steps at that
    bucket (`alpha`). A shape's cost is its ratio times the bucket's level; the ranking of the
    shapes at a batch size depends on their ratios alone.

    Start-up replays time a graph alone on the device; a step in the engine's loop also costs
    its host work, about the same for every shape, so the replays overstate how much more a
    larger shape costs where the step is launch-bound. A shape's steps in the loop at a
    bucket therefore replace its replayed ratio (`real` records which have run): the mean of
    its first samples (one step's time is noisy, and a single sample can keep the best shape
    off), then a moving average (`alpha`), so every shape is
    measured against the same level. At a bucket where a shape has not run yet, its
    ratio comes from the nearest bucket where it has, carried over by how its replayed ratio
    changes between the two (`replayed`), so the replays' bias, measured once, is corrected
    everywhere: the policy runs each shape once (at the first bucket it meets) before it trusts
    the ranking, not once at every bucket (a served batch passes through every bucket, and each
    such step is one on a shape that is likely not the best)."""

    def __init__(self, batch_sizes: list[int], alpha: float = 0.2, level_alpha: float = 0.25) -> None:
        self.sizes = sorted(batch_sizes)
        self.alpha = alpha
        self.level_alpha = level_alpha
        self.level: dict[int, float] = {}  # bucket -> ms of a shape of ratio 1
        self.ratio: dict[tuple[SpecShape, int], float] = {}
        self.last: dict[int, SpecShape] = {}  # bucket -> the shape measured last there
        self.real: set[tuple[SpecShape, int]] = set()  # measured in the loop, not only replayed
        self.samples: Counter[tuple[SpecShape, int]] = Counter()  # the loop's ratio samples
        self.replayed: dict[tuple[SpecShape, int], float] = {}  # each seed's ratio, kept

    def bucket(self, bs: int) -> int:
        """The captured size a batch of `bs` runs at (past the largest: the largest, where it
        runs eagerly and costs about as much per row)."""
        i = bisect.bisect_left(self.sizes, bs)
        return self.sizes[min(i, len(self.sizes) - 1)]

    def seed(self, shape: SpecShape, bs: int, ms: float) -> None:
        b = self.bucket(bs)
        level = self.level.setdefault(b, ms)
        self.ratio[(shape, b)] = self.replayed[(shape, b)] = ms / level

    def observe(self, shape: SpecShape, bs: int, ms: float) -> None:
        b = self.bucket(bs)
        r = self.ratio.get((shape, b))
        switched = self.last.get(b) != shape
        self.last[b] = shape
        first = (shape, b) not in self.real
        self.real.add((shape, b))
        if r is None or b not in self.level:
            self.seed(shape, bs, ms)
            return
        level = self.level[b]
        if first or switched:  # the level is the other shapes', at about this context: compare.
            # The loop's samples replace the replayed ratio (every shape on one level): their
            # mean while they are few (one step's time is noisy), then a moving average.
            n = self.samples[(shape, b)] = self.samples[(shape, b)] + 1
            r += max(self.alpha, 1.0 / n) * (ms / level - r)
            self.ratio[(shape, b)] = r
        self.level[b] = level + self.level_alpha * (ms / r - level)

    def measured(self, shape: SpecShape) -> bool:
        """Whether `shape` ran in the loop at some bucket."""
        return any(s == shape for s, _ in self.real)

    def cost(self, shape: SpecShape, bs: int) -> float | None:
        b = self.bucket(bs)
        r = self.ratio.get((shape, b))
        if r is None or b not in self.level:
            return None
        if (shape, b) not in self.real:
            r = self._carried(shape, b, r)
        return r * self.level[b]

    def _carried(self, shape: SpecShape, b: int, r: float) -> float:
        """Ratio of `shape` at bucket `b`, where it has only been replayed: the loop's ratio at
        the nearest bucket where it ran, times how its replayed ratio changes from there to
        `b` (`r`, the replayed one, where it never ran)."""
        ran = [x for s, x in self.real if s == shape]
        if not ran:
            return r
        near = min(ran, key=lambda x: (abs(x - b), x))
        rep_b, rep_near = self.replayed.get((shape, b)), self.replayed.get((shape, near))
        scale = rep_b / rep_near if rep_b and rep_near else 1.0
        return self.ratio[(shape, near)] * scale

    @property
    def ms(self) -> dict[tuple[SpecShape, int], float]:
        """Every measured (shape, bucket) and its current cost."""
        return {(s, b): r * self.level[b] for (s, b), r in self.ratio.items()}


@dataclass
class Choice:
    shape: SpecShape
    tokens_per_s: dict[str, float]  # every candidate's estimate, by label
    probe: bool = False  # run to re-measure it, not because it is best


class AdaptivePolicy:
    """Picks the shape of each step (module docstring)."""

    def __init__(self, candidates: list[SpecShape], costs: StepCosts,
                 profile: AcceptanceProfile | None = None, probe_every: int = 64,
                 hysteresis: float = 0.03, catch_up_every: int = 64, switch_alpha: float = 0.2,
                 decide_every: int = 8) -> None:
        if not candidates:
            raise ValueError("the adaptive policy needs at least one candidate shape")
        self.candidates = sorted(set(candidates))
        self.costs = costs
        self.profile = profile or AcceptanceProfile()
        self.probe_every = probe_every
        self.hysteresis = hysteresis
        self.catch_up_every = catch_up_every
        self.switch_alpha = switch_alpha
        self.decide_every = decide_every
        # batch-size bucket -> the step it was last decided at, and the requests then (a batch
        # of few requests decides anew when they change: their own acceptance counts)
        self.decided: dict[int, tuple[int, tuple[int, ...] | None]] = {}
        self.catch_up_ms: dict[int, float] = {}  # batch-size bucket -> a catch-up's time
        self.steps = 0
        self.chosen: dict[int, str] = {}  # batch-size bucket -> label of the last choice
        self.kept: dict[int, SpecShape] = {}  # batch-size bucket -> the shape it runs (probes aside)
        self.ran: dict[SpecShape, int] = {}  # shape -> the decision count when it last ran

    def estimates(self, bs: int, rids: list[int] | None = None) -> dict[SpecShape, float]:
        """Expected tokens per second of every candidate with a measured cost at batch `bs`
        (`rids`: the batch's requests, whose own acceptance counts)."""
        out = {}
        for s in self.candidates:
            ms = self.costs.cost(s, bs)
            if ms is not None and ms > 0:
                if s.off:
                    ms += self.catch_up_ms.get(self.costs.bucket(bs), 0.0) / self.catch_up_every
                out[s] = bs * self.profile.expected_tokens(s, rids) / ms * 1e3
        return out

    def observe_catch_up(self, bs: int, ms: float) -> None:
        """A catch-up of the draft at batch `bs` took `ms` (seeded by start-up passes)."""
        b = self.costs.bucket(bs)
        old = self.catch_up_ms.get(b)
        self.catch_up_ms[b] = ms if old is None else old + self.switch_alpha * (ms - old)

    def choose(self, bs: int, rids: list[int] | None = None) -> Choice:
        b = self.costs.bucket(bs)
        if len(self.candidates) == 1:  # nothing to choose: no estimates, no probes
            self.chosen[b] = self.candidates[0].label
            return Choice(self.candidates[0], {})
        kept = self.kept.get(b)
        own = tuple(rids) if rids is not None and len(rids) <= AcceptanceProfile.PER_REQUEST_MAX \
            else None
        at, who = self.decided.get(b, (-self.decide_every, None))
        if (kept is not None and self.steps + 1 - at < self.decide_every and who == own
                and not (self.probe_every and (self.steps + 1) % self.probe_every == 0)):
            self.steps += 1  # (between decisions: the kept shape, no estimates)
            self.chosen[b] = kept.label
            return Choice(kept, {})
        if rids is not None:
            self.profile.keep(rids)
        est = self.estimates(bs, rids)
        unmeasured = [s for s in self.candidates if s not in est or not self.costs.measured(s)]
        if unmeasured:  # every candidate runs once (at the first bucket) before any is chosen
            self.chosen[self.costs.bucket(bs)] = unmeasured[0].label
            return Choice(unmeasured[0], {s.label: v for s, v in est.items()}, probe=True)
        ranked = sorted(est, key=lambda s: (-est[s], s))
        self.steps += 1
        again = b in self.decided
        self.decided[b] = (self.steps, own)
        pick, probe = ranked[0], False
        last = kept
        if last is not None and last in est and est[last] >= (1 - self.hysteresis) * est[pick]:
            pick = last
        elif pick.off and (last is None or not last.off):  # off only if it pays for the way back
            spec = [s for s in ranked if not s.off]
            t_off = self.costs.cost(pick, bs) or 0.0
            if spec and t_off > 0:
                margin = self.catch_up_ms.get(b, 0.0) / (self.catch_up_every * t_off)
                if est[pick] <= est[spec[0]] * (1 + margin):
                    pick = spec[0]
        self.kept[b] = pick
        others = [s for s in ranked if s != pick and not s.off]
        carried = [s for s in others if (s, b) not in self.costs.real]
        if again and carried:  # a bucket that stays busy measures what it only carried
            pick, probe = carried[0], True
        elif others and self.probe_every and self.steps % self.probe_every == 0:
            # the one measured longest ago: every shape's ratio is re-measured in turn
            pick, probe = min(others, key=lambda s: self.ran.get(s, -1)), True
        self.chosen[b] = pick.label
        return Choice(pick, {s.label: v for s, v in est.items()}, probe)

    def observe(self, shape: SpecShape, bs: int, ms: float | None, accept_lens: list[int],
                rids: list[int] | None = None) -> None:
        """What one step of `shape` at batch `bs` took (None: not measured) and accepted (per
        request `rids`)."""
        if ms is not None:
            self.costs.observe(shape, bs, ms)
        self.ran[shape] = self.steps
        self.profile.update(shape, accept_lens, rids)
