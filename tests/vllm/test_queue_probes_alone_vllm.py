"""Queue depth from probes alone against a real vLLM (CPU build, `--max-num-seqs 4`).

The engine serves another process (`foreign_load`); the daemon only probes, with no
`metrics_url`; the test reads `vllm:num_requests_waiting` / `vllm:num_requests_running` itself.
Levels: Poisson at half the capacity, closed loops of 2× and 4× the slots; waiting MAE ≤
max(1, 25 % of the mean true depth), running MAE ≤ max(1, 25 % of the slots), against the
truth averaged over the trailing 5 s, at every level. Below saturation the running figure is
read from the decode slowdown, and vLLM's CPU step grows by a few percent of itself a sequence
(`bench/decode_slowdown.py`): less than the gaps move between probes, so the estimate makes
no running figure there (`_MIN_SLOWDOWN`; before, it read 3.0 for 1.6 and 3.5 for 2.8).
Where it makes one, the bound holds; while a queue lasts it must make one (every slot).

And once without the hint: vLLM's CPU step grows by 1 to 6 ms a sequence against gaps of 30 to
60 ms, and the slots read from the pairs' jumps were 4 in one run and 8 in another (2026-12-02).
Since the learner reads them only where resamples of its data agree
(`DecodeModel.learned_slots`), what it reports must never be worse than saying it does not
know: no count but 4 is ever exported, and wherever a figure is made while a queue lasts it
meets the bounds (no figure at all is made while the slots are unknown).
"""

from __future__ import annotations

import pytest

from tests.support.probes_alone_accuracy import (
    Level,
    check,
    evidence,
    measure_capacity,
    paced,
    probes_like_traffic,
    run_levels,
    table,
)
from tests.support.vllm import SLOTS

pytestmark = pytest.mark.vllm
ANSWER = ("--max-tokens", "16")  # the traffic's answers: 8..24 tokens, mean 16
PROBE = probes_like_traffic(SLOTS, 16)


async def test_probes_alone_track_vllms_queue(vllm: str) -> None:
    capacity = await measure_capacity(vllm, 2 * SLOTS, 20, *ANSWER)
    levels = [
        Level("poisson0.5", "poisson", rate=0.5 * capacity),
        *(
            paced(Level(f"closed{k}x", "closed", workers=k * SLOTS), capacity, SLOTS, 10, 30)
            for k in (2, 4)
        ),
    ]
    scores = await run_levels(
        vllm, levels, PROBE, settle=10, seconds=30, learn=20, learn_grace=60, load_args=ANSWER
    )
    paces = ", ".join(f"{lv.name} {lv.settle:.0f}+{lv.seconds:.0f} s" for lv in levels[1:])
    note = f"vLLM --max-num-seqs {SLOTS}, capacity {capacity:.2f}/s, slots hint {SLOTS}; {paces}"
    report = f"{table(scores, note)}\n{evidence(scores)}"
    print("\n" + report, flush=True)
    assert not check(scores[1:], SLOTS), report  # a queue: every slot, a running figure made
    assert not check(scores[:1], SLOTS, running_made=False), report  # below: where made
    for score in scores:
        assert score.bases.most_common(1)[0][0] == "probes_hint", report


async def test_without_the_hint_the_slots_are_right_or_unknown(vllm: str) -> None:
    capacity = await measure_capacity(vllm, 2 * SLOTS, 20, *ANSWER)
    levels = [
        # Below saturation for the pairs the slots are read from (sixty-four, a probe a
        # second with a companion each), then a queue for the probes at full batch.
        Level("poisson0.5", "poisson", rate=0.5 * capacity, settle=120),
        paced(Level("closed2x", "closed", workers=2 * SLOTS), capacity, SLOTS, 10, 30),
    ]
    target = {k: v for k, v in PROBE.items() if k != "slots"}
    scores = await run_levels(vllm, levels, target, settle=10, seconds=30, load_args=ANSWER)
    learned = sorted({s for score in scores for s in score.slots})
    note = f"vLLM --max-num-seqs {SLOTS}, capacity {capacity:.2f}/s, no hint; learned {learned}"
    report = f"{table(scores, note)}\n{evidence(scores)}"
    print("\n" + report, flush=True)
    assert learned in ([], [SLOTS]), report  # unknown, or right
    scored = [score.known_only() for score in scores[1:] if any(score.known)]
    assert not check(scored, SLOTS), report  # where a figure is made, it holds
