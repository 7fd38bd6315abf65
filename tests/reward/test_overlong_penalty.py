"""DAPO's overlong reward shaping (``OverlongPenalty``): 0 up to L_max − L_cache, linear to −1
at L_max, −1 beyond; read from each sample's ``response_tokens``; bad knobs refused."""

from __future__ import annotations

import pytest

from unirl.config import ConfigError
from unirl.reward.base import RewardError
from unirl.reward.local import OverlongPenalty, overlong_penalty


def test_penalty_by_hand() -> None:
    # L_max 20, L_cache 4: free up to 16, then -1/4 per token, -1 at 20 and past it
    got = [overlong_penalty(n, 20, 4) for n in (1, 16, 17, 18, 19, 20, 21, 50)]
    assert got == [0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0, -1.0]
    assert overlong_penalty(6, 6, 6) == -1.0 and overlong_penalty(0, 6, 6) == 0.0


def test_component_scores_response_tokens_and_names_what_is_missing() -> None:
    scorer = OverlongPenalty(max_tokens=6, cache_tokens=2)
    meta = [{"response_tokens": n} for n in (3, 4, 5, 6)]
    out = scorer.score_texts(["a"] * 4, ["p"] * 4, meta)
    assert out.scores["overlong"].tolist() == [0.0, 0.0, -0.5, -1.0]
    with pytest.raises(RewardError, match="sample 1 has no response_tokens"):
        scorer.score_texts(["a"] * 2, ["p"] * 2, [{"response_tokens": 1}, {}])


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"max_tokens": 0, "cache_tokens": 1}, r"OverlongPenalty\.max_tokens must be >= 1"),
        ({"max_tokens": 6, "cache_tokens": 7}, r"cache_tokens must be in \[1, max_tokens=6\]"),
        ({"max_tokens": 6, "cache_tokens": 0}, r"cache_tokens must be in \[1, max_tokens=6\]"),
    ],
)
def test_bad_knobs_are_refused(kw: dict[str, int], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        OverlongPenalty(**kw)
