"""Host time of the adaptive policy per step (choose + observe) at batch 1, 4, 8 and 32 over the
default candidates, with seeded costs and random accepted lengths: what the policy adds to every
step's critical path.

    python lab/policy_cost.py
"""

import random
import time

from hotspec.core.spec_shape import DEFAULT_CANDIDATES, SpecShape
from hotspec.speculative.adaptive import AdaptivePolicy, StepCosts

shapes = [SpecShape.parse(c) for c in DEFAULT_CANDIDATES]
for bs in (1, 4, 8, 32):
    pol = AdaptivePolicy(shapes, StepCosts([1, 2, 4, 8, 16, 32, 64]))
    for s in shapes:
        pol.costs.seed(s, bs, 1.0 + s.num_draft_tokens * 0.1)
    rng = random.Random(0)
    rids = list(range(bs))
    n = 3000
    lens = [[rng.randint(0, 2) for _ in rids] for _ in range(n)]
    ms = [1.0 + rng.random() * 0.1 for _ in range(n)]
    zeros = [0] * bs
    t0 = time.perf_counter()
    for i in range(n):
        c = pol.choose(bs, rids)
        pol.observe(c.shape, bs, ms[i], zeros if c.shape.off else lens[i], rids)
    dt = (time.perf_counter() - t0) / n * 1e6
    print(f"bs {bs}: {dt:.1f} us per step (choose + observe)")
