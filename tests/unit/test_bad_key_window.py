"""The wrong-key guard reads its per-window counts as a sliding window, so a guesser cannot send
the limit just before a window edge and the limit again just after it."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.test import RequestFactory
from rest_framework import exceptions

from api.authentication import BadKeyGuard, seconds_until_below

LIMIT, WINDOW = 30, 60


def test_under_the_limit_nothing_waits():
    assert seconds_until_below(LIMIT, WINDOW, elapsed=10, current=29, previous=0) == 0
    assert seconds_until_below(LIMIT, WINDOW, elapsed=30, current=10, previous=38) == 0  # 10 + 19


def test_a_full_previous_window_still_blocks_just_after_the_edge():
    wait = seconds_until_below(LIMIT, WINDOW, elapsed=0.2, current=0, previous=30)
    # 30 * (1 - t/60) <= 29 once t >= 2 s, so 1.8 s after 0.2 s.
    assert wait == pytest.approx(1.8)
    assert seconds_until_below(LIMIT, WINDOW, elapsed=2.0, current=0, previous=30) == 0


def test_a_full_current_window_waits_past_its_end():
    # 40 s left in this window, then 40 * (1 - t/60) <= 29 once t >= 16.5 s of the next.
    assert seconds_until_below(LIMIT, WINDOW, elapsed=20, current=40, previous=0) == pytest.approx(40 + 16.5)


@pytest.mark.django_db
def test_the_guard_blocks_across_a_window_edge():
    cache.clear()
    request = RequestFactory().get("/", REMOTE_ADDR="10.9.8.7")
    before_edge = 120 * WINDOW - 0.5
    guard = BadKeyGuard(request, now=before_edge)
    for _ in range(LIMIT):
        guard.check()
        guard.record_failure()
    with pytest.raises(exceptions.Throttled):
        BadKeyGuard(request, now=before_edge).check()
    after_edge = BadKeyGuard(request, now=120 * WINDOW + 0.5)  # a fixed window would start at 0
    with pytest.raises(exceptions.Throttled) as refused:
        after_edge.check()
    assert 1 <= refused.value.wait <= 2
    BadKeyGuard(request, now=120 * WINDOW + 2.5).check()  # one guess per 2 s: 30 per minute
    BadKeyGuard(RequestFactory().get("/", REMOTE_ADDR="10.9.8.8"), now=before_edge).check()
    cache.clear()
