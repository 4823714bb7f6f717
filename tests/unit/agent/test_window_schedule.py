"""The aligned window schedule: rank 0 decides, the other ranks read its decisions off the
training thread, every rank opens windows on the same steps, and the overhead budget of the most
expensive rank holds."""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
from mfuscope.agent._health import RateLimitedLog
from mfuscope.agent._periodic import Periodic
from mfuscope.agent._store_agreement import BackgroundAgreement, StoreAgreement
from mfuscope.agent._window_schedule import (
    Agreement,
    AgreementError,
    AlignedSchedule,
    LocalAgreement,
    RankView,
    ScheduleParams,
)

from tests.support.waiting import wait_until


def _hash_store_agreement() -> Agreement:
    import torch.distributed as dist

    return StoreAgreement(dist.HashStore(), "mfuscope/windows/test")


AGREEMENTS: list[Callable[[], Agreement]] = [LocalAgreement, _hash_store_agreement]


@dataclass
class SimRank:
    """One simulated rank: its schedule, what it measures, and the windows it opened."""

    schedule: AlignedSchedule
    cost_s: float  # what this rank measures for each of its windows
    step_s: float = 0.05
    analysis_steps: int = 3  # its analysis finishes this many steps after the window ends
    fail_windows: set[int] = field(default_factory=set)  # window starts it measures no cost of
    offset: int = 0  # its step number for the training step rank 0 numbers 0
    opened: list[int] = field(default_factory=list)
    pending: dict[int, int] = field(default_factory=dict)  # window start -> step its cost is in
    last_cost_s: float | None = None

    def view(self) -> RankView:
        return RankView(step_s=self.step_s, cost_s=self.last_cost_s)

    def run_step(self, step: int, window_steps: int) -> None:
        if self.schedule.opens_at(step):
            self.opened.append(step)
            self.pending[step] = step + window_steps - 1 + self.analysis_steps
        for start, done in list(self.pending.items()):
            if done == step:
                del self.pending[start]
                if start not in self.fail_windows:
                    self.last_cost_s = self.cost_s
                    self.schedule.record_cost(start, self.cost_s)
                self.schedule.window_done()
        self.schedule.step_ended(step, self.view)


def _simulate(ranks: list[SimRank], steps: int, window_steps: int, seed: int = 0) -> None:
    """Every rank runs every step; which rank gets to each step first changes at random."""
    order = random.Random(seed)
    for step in range(steps):
        for rank in order.sample(ranks, len(ranks)):
            rank.run_step(step + rank.offset, window_steps)


def _ranks(
    agreement: Agreement,
    params: ScheduleParams,
    costs: list[float],
    step_s: float = 0.05,
    analysis_steps: int = 3,
) -> list[SimRank]:
    """Simulated ranks, rank 0 (the first) deciding."""
    return [
        SimRank(
            AlignedSchedule(params, agreement, members=len(costs), decider=rank == 0),
            cost_s=cost,
            step_s=step_s,
            analysis_steps=analysis_steps,
        )
        for rank, cost in enumerate(costs)
    ]


@pytest.mark.parametrize("make_agreement", AGREEMENTS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ranks_with_different_costs_open_the_same_windows_within_the_largest_budget(
    make_agreement: Callable[[], Agreement], seed: int
) -> None:
    # A window every 20 steps of 50 ms (1 s) or every 100 s; 5% budget. Rank 0 measures 0.1 s
    # per window (needs 2 s = 40 steps between starts), rank 1 0.4 s (8 s = 160 steps).
    params = ScheduleParams(
        first_window_step=10, every_steps=20, every_s=100.0, window_steps=3, max_overhead_ratio=0.05
    )
    ranks = _ranks(make_agreement(), params, [0.1, 0.4])
    _simulate(ranks, 2000, params.window_steps, seed)
    starts = ranks[0].opened
    assert starts == ranks[1].opened
    assert len(starts) >= 10 and starts[0] == 10
    # Every gap, the first included, is the largest budget: the first check (a window's last
    # step) offers the 20-step cadence, but each window's cost is in 3 steps later, so the
    # next check, halfway there, postpones it to the budget.
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert all(gap >= 160 for gap in gaps), gaps
    # ... and not much more than the budget asks (the postponement lands on the budget itself)
    assert all(gap == 160 for gap in gaps), gaps
    # amortised: the most expensive rank's windows cost at most the budget of the time they span
    span_s = (starts[-1] - starts[0]) * 0.05
    assert 0.4 * (len(starts) - 1) <= params.max_overhead_ratio * span_s + 1e-9


@pytest.mark.parametrize("make_agreement", AGREEMENTS)
def test_cadence_in_seconds_and_steps_whichever_comes_first(
    make_agreement: Callable[[], Agreement],
) -> None:
    # 1 s steps: every 5 s comes before every 100 steps; a negligible cost does not bind
    # (analyses done the step after each window: long before the next one)
    params = ScheduleParams(
        first_window_step=0, every_steps=100, every_s=5.0, window_steps=2, max_overhead_ratio=0.5
    )
    ranks = _ranks(make_agreement(), params, [0.01, 0.02], step_s=1.0, analysis_steps=1)
    _simulate(ranks, 40, params.window_steps)
    assert ranks[0].opened == ranks[1].opened == list(range(0, 40, 5))


def test_a_failed_window_and_a_slow_analysis_on_one_rank_move_nobody_apart() -> None:
    params = ScheduleParams(
        first_window_step=4, every_steps=10, every_s=1e9, window_steps=2, max_overhead_ratio=1.0
    )
    agreement = LocalAgreement()
    fast = SimRank(AlignedSchedule(params, agreement, members=2), cost_s=0.0, analysis_steps=1)
    # this rank's analyses take 15 steps (longer than the 10-step cadence) and its second
    # window fails (no cost)
    slow = SimRank(
        AlignedSchedule(params, agreement, members=2, decider=False),
        cost_s=0.0,
        analysis_steps=15,
        fail_windows={4},
    )
    _simulate([fast, slow], 200, params.window_steps, seed=3)
    assert fast.opened == slow.opened
    # windows were postponed while the slow rank's analysis was out (the deciding rank's own
    # were done long before), so no window opened while one of its analyses was still running
    for start in slow.opened[1:]:
        earlier = [s for s in slow.opened if s < start]
        assert start > earlier[-1] + params.window_steps - 1 + 15


def test_ranks_numbering_steps_from_different_origins_profile_the_same_training_steps() -> None:
    # rank 1 resumed its counter at 1000 for the same training step rank 0 calls 0
    params = ScheduleParams(
        first_window_step=3, every_steps=7, every_s=1e9, window_steps=2, max_overhead_ratio=1.0
    )
    agreement = LocalAgreement()
    rank0 = SimRank(AlignedSchedule(params, agreement, members=2), cost_s=0.0)
    rank1 = SimRank(
        AlignedSchedule(params, agreement, step_offset=1000, members=2, decider=False),
        cost_s=0.0,
        offset=1000,
    )
    _simulate([rank0, rank1], 60, params.window_steps)
    assert rank0.opened == [3, 10, 17, 24, 31, 38, 45, 52, 59]
    assert rank1.opened == [1000 + s for s in rank0.opened]


def test_the_cheap_deciding_rank_still_offers_the_costly_rank_s_budget() -> None:
    params = ScheduleParams(
        first_window_step=0, every_steps=10, every_s=1e9, window_steps=1, max_overhead_ratio=1.0
    )
    agreement = LocalAgreement()
    cheap = AlignedSchedule(params, agreement, members=2)  # rank 0: it decides
    costly = AlignedSchedule(params, agreement, members=2, decider=False)
    cheap_view = RankView(step_s=1.0, cost_s=0.5)  # 1 s steps; its window cost 0.5 s
    for schedule in (cheap, costly):
        schedule.step_ended(0, lambda: cheap_view)  # window 0; the first check: cadence, 10
    costly.record_cost(0, 30.0)  # its window 0 cost 30 s: 30 steps at a 100% budget
    cheap.window_done()
    costly.window_done()
    opened = []
    for step in range(1, 40):
        for schedule in (cheap, costly):
            if schedule.opens_at(step):
                opened.append(step)
            schedule.step_ended(step, lambda: cheap_view)
    assert opened == [30, 30]


def test_decisions_follow_a_slower_step_time_for_a_cadence_in_seconds() -> None:
    # every 100 steps or 20 s; steps of 0.1 s at the first check (100 steps = 10 s), then 1 s
    params = ScheduleParams(
        first_window_step=0, every_steps=100, every_s=20.0, window_steps=1, max_overhead_ratio=1.0
    )
    schedule = AlignedSchedule(params, LocalAgreement())
    schedule.step_ended(0, lambda: RankView(step_s=0.1))
    schedule.window_done()
    opened = [step for step in range(1, 100) if _ended(schedule, step, RankView(step_s=1.0))]
    # planned for step 100; the check halfway (step 50) sees 1 s steps, 20 s overdue: opens as
    # soon as a decision can (two steps on: the lead the other ranks read it in), and from
    # there every 20 steps (a stale plan is corrected within half its gap)
    assert opened == [52, 72, 92]


def _ended(schedule: AlignedSchedule, step: int, view: RankView) -> bool:
    """Run one step; whether a window opened at it (marked done at once)."""
    opens = schedule.opens_at(step)
    schedule.step_ended(step, lambda: view)
    if opens:
        schedule.window_done()
    return opens


class BrokenAgreement(LocalAgreement):
    def publish(self, key: str, value: int) -> None:
        raise AgreementError("store: connection refused")


def test_a_rank_that_cannot_agree_stops_profiling_instead_of_guessing() -> None:
    params = ScheduleParams(
        first_window_step=1, every_steps=2, every_s=1e9, window_steps=1, max_overhead_ratio=1.0
    )
    schedule = AlignedSchedule(params, BrokenAgreement())
    opened = []
    for step in range(10):
        if schedule.opens_at(step):
            opened.append(step)
        schedule.step_ended(step, lambda: RankView())
    assert opened == [1]  # the first window needs no decision
    assert schedule.failure == "store: connection refused"


def test_profiling_off_opens_nothing() -> None:
    params = ScheduleParams(
        first_window_step=0, every_steps=1, every_s=0.0, window_steps=1, max_overhead_ratio=1.0
    )
    schedule = AlignedSchedule(params, LocalAgreement(), enabled=False)
    for step in range(5):
        assert not schedule.opens_at(step)
        schedule.step_ended(step, lambda: RankView())


@pytest.mark.parametrize(
    "bad",
    [
        {"every_steps": 0},
        {"window_steps": 0},
        {"every_s": float("nan")},
        {"max_overhead_ratio": 0.0},
        {"max_overhead_ratio": 1.5},
    ],
)
def test_bad_parameters_are_refused(bad: dict[str, float]) -> None:
    values: dict[str, float] = {
        "first_window_step": 0,
        "every_steps": 1,
        "every_s": 1.0,
        "window_steps": 1,
        "max_overhead_ratio": 0.5,
        **bad,
    }
    with pytest.raises(ValueError):
        ScheduleParams(**values)  # type: ignore[arg-type]


def test_store_agreement_publishes_decisions_and_keeps_the_largest_cost() -> None:
    import torch.distributed as dist

    store = dist.HashStore()
    one, two = StoreAgreement(store, "p"), StoreAgreement(store, "p")
    assert two.fetched("start/1/5") is None  # not published yet: no wait
    one.publish("start/1/5", 20)
    assert two.fetched("start/1/5") == 20
    assert one.read("cost/0") is None
    one.raise_to("cost/0", 0.25)
    two.raise_to("cost/0", 0.5)
    one.raise_to("cost/0", 0.125)
    assert two.read("cost/0") == 0.5
    # another launch's prefix sees none of it
    assert StoreAgreement(store, "q").read("cost/0") is None
    store.set("p/cost/1", "garbage")
    with pytest.raises(AgreementError, match="not a number"):
        one.read("cost/1")
    store.set("p/start/2/9", "garbage")
    with pytest.raises(AgreementError, match="not a step"):
        one.fetched("start/2/9")


class CountingAgreement(LocalAgreement):
    def __init__(self) -> None:
        super().__init__()
        self.decisions = 0

    def publish(self, key: str, value: int) -> None:
        self.decisions += 1
        super().publish(key, value)


def test_step_time_noise_keeps_the_cadence_in_about_log2_gap_decisions_per_window() -> None:
    # every 1000 steps or 100 s; step times jitter 95-105 ms (100 s = 952-1053 steps)
    params = ScheduleParams(
        first_window_step=0, every_steps=10_000, every_s=100.0, window_steps=1, max_overhead_ratio=1
    )
    agreement = CountingAgreement()
    schedule = AlignedSchedule(params, agreement)
    noise = random.Random(0)
    opened = []
    for step in range(3001):
        view = RankView(step_s=noise.uniform(0.095, 0.105))
        if _ended(schedule, step, view):
            opened.append(step)
    gaps = [b - a for a, b in itertools.pairwise(opened)]
    assert len(gaps) == 3 and all(940 <= gap <= 1060 for gap in gaps), opened
    # about log2(1000) = 10 decisions per window, not one per step of drift
    assert agreement.decisions <= 3 * 12, agreement.decisions


class DelayedAgreement(LocalAgreement):
    """Followers see a decision only `delay(step)` steps after the decider published it."""

    def __init__(self, delay: Callable[[int], int]) -> None:
        super().__init__()
        self.now = 0
        self.delay = delay
        self.published_at: dict[str, int] = {}

    def publish(self, key: str, value: int) -> None:
        self.published_at[key] = self.now
        super().publish(key, value)

    def fetched(self, key: str) -> int | None:
        at = self.published_at.get(key)
        if at is None or self.now - at < self.delay(at):
            return None
        return super().fetched(key)


def test_a_follower_that_learns_a_start_too_late_skips_it_and_stays_aligned() -> None:
    params = ScheduleParams(
        first_window_step=0, every_steps=10, every_s=1e9, window_steps=1, max_overhead_ratio=1.0
    )
    # Decisions published at steps 5-11 reach the follower 3 steps late (past their lead).
    agreement = DelayedAgreement(lambda at: 3 if 5 <= at < 12 else 0)
    decider = AlignedSchedule(params, agreement, members=2)
    missed: list[str] = []
    follower = AlignedSchedule(params, agreement, members=2, decider=False, on_missed=missed.append)
    opened: dict[int, list[int]] = {0: [], 1: []}
    for step in range(60):
        agreement.now = step
        for rank, schedule in enumerate((decider, follower)):
            if _ended(schedule, step, RankView(step_s=1.0)):
                opened[rank].append(step)
            schedule.window_done()  # as the coordinator does at every idle step
    assert opened[0] == [0, 10, 20, 30, 40, 50]
    # decided at step 8, known at step 11
    assert follower.missed == 1 and missed == [
        "profiled window at step 10 skipped on this rank (rank 0's decision arrived after it)"
    ]
    assert opened[1] == [0, 20, 30, 40, 50]  # the chain went on: every later window is shared
    assert follower.failure is None


def test_a_decider_that_stops_stops_its_followers() -> None:
    params = ScheduleParams(
        first_window_step=0, every_steps=10, every_s=1e9, window_steps=1, max_overhead_ratio=1.0
    )
    agreement = LocalAgreement()
    decider = AlignedSchedule(params, agreement, members=2)
    follower = AlignedSchedule(params, agreement, members=2, decider=False)
    for step in range(3):
        _ended(decider, step, RankView(step_s=1.0))
        _ended(follower, step, RankView(step_s=1.0))
    decider.close()  # training ended on rank 0 while a decision was pending
    for step in range(3, 20):
        assert not _ended(follower, step, RankView(step_s=1.0))
    assert follower.failure == "rank 0 stopped deciding profiled windows"


class RecordingStore:
    """A `HashStore` that records the thread of every operation."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.store = dist.HashStore()
        self.threads: set[int] = set()
        self.calls = 0  # operations begun

    def __getattr__(self, name: str) -> Callable[..., object]:
        method = getattr(self.store, name)

        def call(*args: object) -> object:
            self.threads.add(threading.get_ident())
            self.calls += 1
            return method(*args)

        return call


PERIODIC = "test-agreement-periodic"


@pytest.fixture
def periodic() -> Iterator[Periodic]:
    """The periodic thread the agreements of a test run their store calls on."""
    thread = Periodic(RateLimitedLog(60.0), name=PERIODIC, clock=time.monotonic)
    yield thread
    thread.stop(10.0)


class ManualPeriodic:
    """A periodic thread that never runs: the test calls the task's `tick` itself."""

    def add(self, name: str, tick: Callable[[], float | None]) -> object:
        return name

    def wake(self, task: object) -> None:
        return None

    def remove(self, task: object, timeout_s: float = 1.0) -> None:
        return None


class PublishedKeys(BackgroundAgreement):
    def __init__(self, connect: Callable[[], StoreAgreement], periodic: Periodic) -> None:
        super().__init__(connect, periodic)
        self.keys: list[str] = []

    def publish(self, key: str, value: int) -> None:
        self.keys.append(key)
        super().publish(key, value)


def test_background_agreement_keeps_every_store_operation_off_the_training_thread(
    periodic: Periodic,
) -> None:
    store = RecordingStore()
    params = ScheduleParams(
        first_window_step=0, every_steps=6, every_s=1e9, window_steps=1, max_overhead_ratio=1.0
    )
    decider = PublishedKeys(lambda: StoreAgreement(store, "p"), periodic)
    follower = BackgroundAgreement(lambda: StoreAgreement(store, "p"), periodic)
    ranks = [
        AlignedSchedule(params, agreement, members=2, decider=agreement is decider)
        for agreement in (decider, follower)
    ]
    opened: dict[int, list[int]] = {0: [], 1: []}
    for step in range(40):
        for rank, schedule in enumerate(ranks):
            if _ended(schedule, step, RankView(step_s=1.0)):
                opened[rank].append(step)
            schedule.record_cost(0, 0.5)
        # A step takes longer than a fetch: each decision reaches the follower within its lead
        # (the late path is tested with `DelayedAgreement`).
        wait_until(
            lambda: all(follower.fetched(key) is not None for key in decider.keys),
            "the follower to fetch every decision",
        )
    assert opened[0] == opened[1] == [0, 6, 12, 18, 24, 30, 36]
    assert store.threads and threading.get_ident() not in store.threads
    for schedule in ranks:
        schedule.close()


def test_background_agreement_fetches_waits_reads_and_fails_off_the_caller(
    periodic: Periodic,
) -> None:
    import torch.distributed as dist

    store = dist.HashStore()
    decider = BackgroundAgreement(lambda: StoreAgreement(store, "p"), periodic)
    follower = BackgroundAgreement(lambda: StoreAgreement(store, "p"), periodic)
    follower.fetch("start/1/4")  # the periodic thread looks for the key
    assert follower.fetched("start/1/4") is None
    decider.publish("start/1/4", 12)
    wait_until(lambda: follower.fetched("start/1/4") == 12, "the follower to fetch 12")
    decider.raise_to("cost/0", 0.5)
    decider.count("done/0")
    wait_until(
        lambda: follower.read("cost/0") == 0.5 and follower.read("done/0") == 1,
        "the follower to read the cost and the count",
    )
    broken = BackgroundAgreement(lambda: StoreAgreement(store, "p"), periodic)
    store.set("p/start/2/9", "garbage")
    broken.fetch("start/2/9")
    with pytest.raises(AgreementError, match="not a step"):
        wait_until(lambda: broken.fetched("start/2/9") and False, "the bad value's failure")
    unreachable = BackgroundAgreement(lambda: 1 / 0, periodic)  # connects at once, on the thread
    with pytest.raises(AgreementError, match="cannot connect"):
        wait_until(lambda: unreachable.read("x") and False, "the connection's failure")
    for agreement in (decider, follower, broken, unreachable):
        agreement.close()


def test_a_store_shared_with_torch_is_looked_at_for_a_decision_never_waited_on() -> None:
    import torch.distributed as dist

    store = dist.HashStore()

    class NoWaitStore:
        """The shared store, whose `get` of an absent key would hold torch's connection."""

        def __getattr__(self, name: str) -> object:
            return getattr(store, name)

        def get(self, key: str) -> bytes:
            assert store.check([key]), "a get that waits"
            return store.get(key)

    polled = StoreAgreement(NoWaitStore(), "p")
    assert polled.fetched("start/1/3") is None  # absent: looked at, not waited for
    StoreAgreement(store, "p").publish("start/1/3", 5)
    assert polled.fetched("start/1/3") == 5


def test_closing_a_follower_still_looking_for_a_decision_ends_its_store_calls(
    periodic: Periodic,
) -> None:
    # A thread left in a store call when the interpreter exits can abort the process at its end
    # (std::terminate from the binding's forced unwinding), so close() must end the calls: the
    # follower only ever makes calls that answer at once, and the thread stops between them.
    store = RecordingStore()
    follower = BackgroundAgreement(lambda: StoreAgreement(store, "p"), periodic)
    follower.fetch("start/1/4")  # no decider ever publishes it
    wait_until(lambda: store.threads, "the follower's first look")
    follower.close(timeout_s=10.0)
    calls = store.calls
    periodic.stop(10.0)
    # No store call after close, and the thread ended within stop's wait: it was between calls
    # that answer at once, not inside one that blocks.
    assert store.calls == calls
    assert PERIODIC not in {t.name for t in threading.enumerate()}
    assert follower.fetched("start/1/4") is None


def test_a_decider_an_hour_late_fails_the_agreement() -> None:
    import torch.distributed as dist

    now = [0.0]
    store = dist.HashStore()
    follower = BackgroundAgreement(
        lambda: StoreAgreement(store, "p"),
        ManualPeriodic(),  # type: ignore[arg-type]
        clock=lambda: now[0],
    )
    follower.fetch("start/1/4")
    pauses: list[float] = []
    while (pause := follower.tick()) is not None:
        pauses.append(pause)
        now[0] += pause
    with pytest.raises(AgreementError, match="no decision"):
        follower.fetched("start/1/4")
    assert pauses[:3] == [0.005, 0.01, 0.02] and max(pauses) == 1.0  # one look a second
    assert 3600.0 < now[0] < 3602.0
    follower.close()
