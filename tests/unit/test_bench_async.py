"""bench async's pure parts: the server-side length law (bench/tail_lengths.py) and the reward at equal trained
tokens (bench/async_tail.py)."""

from __future__ import annotations

import random
import statistics

from grpo_plugin.bench.async_tail import reward_at
from grpo_plugin.bench.tail_lengths import completion_start, lomax_c, remaining_length


def test_lengths_are_heavy_tailed_around_the_median_and_a_continuation_keeps_the_law():
    alpha, c = 1.5, lomax_c(16, 1.5)
    rng = random.Random(0)
    fresh = [remaining_length(1.0 - rng.random(), 0, alpha, c) for _ in range(20000)]
    assert 14 <= statistics.median(fresh) <= 18
    tail = sum(x > 160 for x in fresh) / len(fresh)
    assert 0.04 < tail < 0.08  # ~5.5% past 10x the median
    # a completion interrupted after 20 tokens: what is left is drawn given length > 20; the totals follow the
    # same law as fresh completions longer than 20
    continued = [20 + remaining_length(1.0 - rng.random(), 20, alpha, c) for _ in range(20000)]
    longer = sorted(x for x in fresh if x > 20)
    assert abs(statistics.median(continued) - statistics.median(longer)) <= 3
    assert min(remaining_length(1.0, done, alpha, c) for done in (0, 5, 100)) == 1  # never less than the end token


def test_a_completion_starts_after_the_last_marker_of_its_prompt():
    marker = [32, 61, 32]
    prompt = [7, 8, 32, 61, 32]
    assert completion_start(prompt, marker) == 5
    assert completion_start(prompt + [9, 10, 11], marker) == 5  # a continuation: 3 tokens sampled already
    assert completion_start(prompt + [32, 61, 32, 4], marker) == 8  # the last one (the completion wrote one too)
    assert completion_start([1, 2, 3], marker) == 3  # no marker: nothing sampled yet


def test_the_reward_at_a_token_budget_is_that_of_the_steps_trained_by_then():
    curve = [(100, 0.0), (100, 0.5), (100, 1.0), (100, 1.0), (100, 1.0)]
    assert reward_at(curve, 200) == 0.5  # steps 1-2 trained the budget; the last fifth of them: step 2
    assert reward_at(curve, 500) == 1.0
    assert reward_at([(50, None), (50, 0.25)], 100) == 0.25


def test_the_link_rate_is_measured_over_real_connections_with_every_byte_accounted_for():
    from grpo_plugin.bench.netns import tcp_rate

    assert tcp_rate("127.0.0.1", mib=16, streams=1) > 0
    assert tcp_rate("127.0.0.1", mib=16, streams=3) > 0  # 16 MiB in three streams: each stream's share arrives
