"""prober.timings: the binding definitions (docs/design.md §2, §4) with plain integer stamps."""

from __future__ import annotations

from typing import Any

import pytest

from prober import timings
from prober.result import Outcome, RequestResult, TokenSource
from prober.timings import Slo
from tests.support.results import S, result

MS = 1_000_000


def test_dispatch_lag() -> None:
    assert timings.dispatch_lag(result()) == pytest.approx(0.1)
    assert timings.dispatch_lag(result(t_sched_ns=5, t_send_ns=5)) == 0.0


def test_ttft_and_ttfo_differ_for_reasoning_first_streams() -> None:
    r = result()
    assert timings.ttft(r) == pytest.approx(0.5)
    assert timings.ttfo(r) == pytest.approx(1.5)


def test_ttft_counts_from_schedule_including_dispatch_lag() -> None:
    # Sent 0.4 s late: TTFT still counts from t_sched, so a slow client can't hide a slow server.
    r = result(t_sched_ns=0, t_send_ns=int(0.4 * S), t_first_token_ns=int(0.5 * S))
    assert timings.ttft(r) == pytest.approx(0.5)


def test_ttft_ttfo_absent_without_tokens() -> None:
    r = result(Outcome.TIMEOUT_FIRST_TOKEN, t_first_token_ns=None, t_first_content_ns=None)
    assert timings.ttft(r) is None
    assert timings.ttfo(r) is None


def test_ttfo_absent_for_reasoning_only_stream() -> None:
    r = result(t_first_content_ns=None)
    assert timings.ttft(r) == pytest.approx(0.5)
    assert timings.ttfo(r) is None


def test_tpot_over_output_tokens_minus_one() -> None:
    # (2.5 s − 0.5 s) / (11 − 1)
    assert timings.tpot(result()) == pytest.approx(0.2)


def test_tpot_uses_usage_count_not_event_count() -> None:
    r = result(output_tokens=41, token_source=TokenSource.USAGE)
    assert len(r.token_event_ns) == 11
    assert timings.tpot(r) == pytest.approx(2.0 / 40)


@pytest.mark.parametrize("n_out", [0, 1])
def test_tpot_only_when_two_or_more_tokens(n_out: int) -> None:
    assert timings.tpot(result(output_tokens=n_out)) is None


def test_tpot_two_tokens() -> None:
    r = result(
        output_tokens=2,
        t_first_token_ns=S,
        t_last_token_ns=S + 30 * MS,
        token_event_ns=(S, S + 30 * MS),
    )
    assert timings.tpot(r) == pytest.approx(0.03)


def test_tpot_one_event_many_usage_tokens_is_zero() -> None:
    r = result(output_tokens=5, t_first_token_ns=S, t_last_token_ns=S, token_event_ns=(S,))
    assert timings.tpot(r) == 0.0


def test_itl_gaps_one_per_gap() -> None:
    r = result(token_event_ns=(10, 30, 60, 60))
    assert timings.itl_gaps(r) == pytest.approx([20e-9, 30e-9, 0.0])
    assert timings.itl_gaps(result(token_event_ns=(5,))) == []
    assert timings.itl_gaps(result(token_event_ns=())) == []


def test_e2e_only_for_ok() -> None:
    assert timings.e2e(result()) == pytest.approx(3.0)
    for outcome in Outcome:
        if outcome is not Outcome.OK:
            assert timings.e2e(result(outcome)) is None, outcome


# -- goodness -------------------------------------------------------------------------------

SLO = Slo(ttft_seconds=1.0, tpot_seconds=0.1)
SLO_E2E = Slo(ttft_seconds=1.0, tpot_seconds=0.1, e2e_seconds=5.0)


def judged(
    *, ttft_ns: int = S // 2, span_ns: int = S // 2, n_out: int = 11, end_ns: int = 4 * S
) -> RequestResult:
    """An ok result: first token at `ttft_ns`, last `span_ns` later, `n_out` tokens."""
    return result(
        t_first_token_ns=ttft_ns,
        t_first_content_ns=ttft_ns,
        t_last_token_ns=ttft_ns + span_ns,
        token_event_ns=(ttft_ns, ttft_ns + span_ns),
        output_tokens=n_out,
        t_end_ns=end_ns,
    )


@pytest.mark.parametrize(
    ("r", "slo", "good"),
    [
        pytest.param(judged(), SLO, True, id="well-within"),
        pytest.param(judged(ttft_ns=S), SLO, True, id="ttft-equal"),
        pytest.param(judged(ttft_ns=S + 1), SLO, False, id="ttft-over"),
        # TPOT = span / 10: 1 s → exactly 0.1 s per token.
        pytest.param(judged(span_ns=S), SLO, True, id="tpot-equal"),
        pytest.param(judged(span_ns=S + 10), SLO, False, id="tpot-over"),
        pytest.param(judged(end_ns=60 * S), SLO, True, id="e2e-unset-ignored"),
        pytest.param(judged(end_ns=5 * S), SLO_E2E, True, id="e2e-equal"),
        pytest.param(judged(end_ns=5 * S + 1), SLO_E2E, False, id="e2e-over"),
        # One token: no TPOT, however long the "span"; judged on TTFT (and E2E) alone.
        pytest.param(judged(n_out=1, span_ns=10 * S), SLO, True, id="one-token-no-tpot"),
        pytest.param(judged(n_out=1, ttft_ns=S + 1), SLO, False, id="one-token-ttft-over"),
        pytest.param(judged(n_out=1, end_ns=5 * S + 1), SLO_E2E, False, id="one-token-e2e-over"),
    ],
)
def test_is_good(r: RequestResult, slo: Slo, good: bool) -> None:
    assert timings.is_good(r, slo) is good


@pytest.mark.parametrize("outcome", [o for o in Outcome if o is not Outcome.OK])
def test_non_ok_is_never_good(outcome: Outcome) -> None:
    fast = judged(ttft_ns=1, span_ns=10, end_ns=100)
    assert timings.is_good(fast, SLO) is True
    assert timings.is_good(result(outcome, **_stamps(fast)), SLO_E2E) is False


def test_ok_without_token_stamp_is_not_good() -> None:
    assert timings.is_good(result(t_first_token_ns=None), SLO) is False


def _stamps(r: RequestResult) -> dict[str, Any]:
    return {
        "t_first_token_ns": r.t_first_token_ns,
        "t_first_content_ns": r.t_first_content_ns,
        "t_last_token_ns": r.t_last_token_ns,
        "token_event_ns": r.token_event_ns,
        "output_tokens": r.output_tokens,
        "t_end_ns": r.t_end_ns,
    }
