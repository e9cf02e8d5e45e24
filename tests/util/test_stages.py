"""Progress lines and core grants (``cactus_theory.util.stages``), on a fake clock."""

import pytest

from cactus_theory.util.stages import CoreShare, StageLog, clock_text


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_stage_prints_its_progress_and_the_time_left():
    clock, lines = FakeClock(), []
    log = StageLog("job", say=lines.append, clock=clock)
    stage = log.stage("pool mt-bench", 2000, "positions")
    clock.now += 30
    stage.update(500, "shard 1 built")
    clock.now += 30
    stage.update(1000)
    clock.now += 65
    assert stage.finish("2,100 positions") == pytest.approx(125)
    assert lines == [
        "[job 0:00] pool mt-bench: started (2,000 positions)",
        "[job 0:30] pool mt-bench: shard 1 built, 500 of 2,000 positions, ETA 1:30",
        "[job 1:00] pool mt-bench: 1,000 of 2,000 positions, ETA 1:00",
        "[job 2:05] pool mt-bench: done in 2:05, 2,100 positions",
    ]


def test_a_stage_of_unknown_length_tells_no_eta():
    lines = []
    stage = StageLog("job", say=lines.append, clock=FakeClock()).stage("load")
    stage.update(3, "files")
    assert lines[-1] == "[job 0:00] load: files, 3" and "ETA" not in "".join(lines)
    assert clock_text(3725) == "1:02:05" and clock_text(59.6) == "1:00"


def test_a_grant_is_read_by_the_child_and_quiet_is_waited_for(tmp_path):
    share = CoreShare(tmp_path / "cores.json")
    assert share.threads() == 1 and not share.quiet()  # nothing granted yet
    share.grant(1, quiet=False)
    waits, lines = [], []

    def sleep(seconds):
        waits.append(seconds)
        if len(waits) == 3:
            share.grant(2, quiet=True)

    clock = FakeClock()
    log = StageLog("job", say=lines.append, clock=clock)
    waited = share.wait_quiet(log, "speed", poll=1.0, every=60.0, sleep=sleep, clock=clock)
    assert waits == [1.0, 1.0, 1.0] and waited == 0.0
    assert share.threads() == 2 and share.quiet()
    assert lines == ["[job 0:00] speed: waiting for a quiet machine (0:00)"]
    alone = CoreShare(None)  # no parent: every core, quiet at once
    assert alone.quiet() and alone.threads() >= 1
    assert alone.wait_quiet(sleep=lambda s: pytest.fail("no wait when alone")) >= 0
    with pytest.raises(ValueError, match="threads"):
        share.grant(0, quiet=True)
    (tmp_path / "cores.json").write_text("{not json")
    assert share.threads() == 1 and not share.quiet()  # damaged: the safe reading


def test_a_silent_log_says_it_is_still_working():
    """The heartbeat prints on the current stage once the log has been silent for
    ``every`` seconds, and nothing while lines keep coming."""
    clock, lines = FakeClock(), []
    log = StageLog("job", say=lines.append, clock=clock)
    log.stage("load")
    stop = log.heartbeat(every=30.0, poll=0.01)
    try:
        import time

        clock.now += 10
        time.sleep(0.1)
        assert len(lines) == 1  # 10 s of silence: nothing yet
        clock.now += 25
        for _ in range(200):
            if len(lines) > 1:
                break
            time.sleep(0.01)
    finally:
        stop()
    assert (
        lines[1] == "[job 0:35] load: still working (0:35 since the last line, 0:35 into the stage)"
    )
