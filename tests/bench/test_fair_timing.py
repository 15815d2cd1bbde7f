"""c2.bench.fair: interleaved timing, medians with spread, the load check and its warning."""

import io
import itertools
import os

import pytest

from c2.bench import fair


def test_interleave_alternates_runs_and_times_each_call():
    calls = []
    clock = itertools.count().__next__  # each reading advances one second
    runs = {"a": lambda: calls.append("a") or "ra", "b": lambda: calls.append("b") or "rb"}
    timings, results = fair.interleave(runs, repeats=3, warmup=1, clock=clock)
    assert calls == ["a", "b"] * 4  # one warm-up round, then three interleaved rounds
    assert results == {"a": "ra", "b": "rb"}
    assert timings["a"].times == (1, 1, 1) and timings["b"].times == (1, 1, 1)


def test_interleave_pauses_before_each_timed_call_only():
    slept = []
    fair.interleave({"a": lambda: None, "b": lambda: None}, 2, pause=0.5, sleep=slept.append)
    assert slept == [0.5] * 4
    with pytest.raises(ValueError, match="repeats"):
        fair.interleave({"a": lambda: None}, 0)


def test_timing_median_and_spread():
    t = fair.Timing((0.3, 0.1, 0.2, 0.5))
    assert t.median == pytest.approx(0.25)
    assert (t.min, t.max) == (0.1, 0.5)
    assert t.iqr == pytest.approx(0.35 - 0.175)
    s = t.summary()
    assert (
        s["median_s"] == pytest.approx(0.25)
        and s["n"] == 4
        and s["times_s"] == [0.3, 0.1, 0.2, 0.5]
    )
    assert t.spread() == "250.0 (100.0-500.0)"
    assert fair.Timing((0.2,)).iqr == 0.0


def test_quiet_machine_passes_without_warning():
    out = io.StringIO()
    # The machine's busy CPU seconds grew only by this process's own: no other process ran.
    readings = iter([(100.0, 10.0), (103.0, 13.0)])
    cpu = lambda: next(readings)
    check = fair.load_check(load=lambda: (0.1, 0.2, 0.3), out=out, cpu=cpu)
    check = fair.finish(check, load=lambda: (1.9, 0.5, 0.3), out=out, cpu=cpu)  # its own threads
    assert "WARNING" not in out.getvalue()
    assert "load average before: 0.10 / 0.20 / 0.30" in out.getvalue()
    assert "load average after: 1.90" in out.getvalue()
    assert "other processes used 0.00 cores" in out.getvalue()
    rec = check.record()
    assert rec["load_average_before"] == (0.1, 0.2, 0.3)
    assert rec["load_average_after"] == (1.9, 0.5, 0.3)
    assert rec["machine_busy"] is False
    assert f", {os.cpu_count()} cores" in rec["processor"]


def test_busy_machine_warns_loudly_and_records_it():
    out = io.StringIO()
    check = fair.load_check(load=lambda: (2.5, 2.0, 1.0), out=out)
    assert check.busy and "WARNING: the machine is busy" in out.getvalue()
    fair.finish(check, load=lambda: (3.0, 2.0, 1.0), out=out)
    assert out.getvalue().count("WARNING") == 2
    assert check.record()["machine_busy"] is True


def test_require_quiet_refuses_a_busy_machine():
    out = io.StringIO()
    with pytest.raises(SystemExit) as e:
        fair.load_check(require_quiet=True, load=lambda: (0.5, 0.0, 0.0), out=out)
    assert e.value.code == 2
    assert "REFUSED" in out.getvalue()
    fair.load_check(require_quiet=True, load=lambda: (0.49, 0.0, 0.0), out=io.StringIO())


def test_other_processes_cpu_during_the_run_marks_it_busy():
    out = io.StringIO()
    readings = iter([(100.0, 10.0), (104.0, 11.0)])  # 3 CPU seconds not this process's
    cpu = lambda: next(readings)
    check = fair.load_check(load=lambda: (0.1, 0.1, 0.1), out=out, cpu=cpu)
    assert "WARNING" not in out.getvalue()
    fair.finish(check, load=lambda: (0.1, 0.1, 0.1), out=out, cpu=cpu)
    assert check.others_cores > 0.5 and "WARNING: the machine is busy" in out.getvalue()
    check = fair.LoadCheck(before=(0.1, 0.1, 0.1), others_cores=0.7)
    assert check.busy
    assert not fair.LoadCheck(before=(0.1, 0.1, 0.1), others_cores=0.2).busy
    assert not fair.LoadCheck(before=(0.1, 0.1, 0.1)).busy


def test_cpu_seconds_reads_machine_and_own_time():
    cpu = fair.cpu_seconds()
    if cpu is None:
        pytest.skip("no /proc/stat")
    machine, own = cpu
    assert machine > 0 and own > 0
