import threading

from delta_log.log.read_ahead import ReadAhead


def _one(_: object) -> int:
    return 1


def test_a_result_is_read_once_and_taken_once():
    ra: ReadAhead[int] = ReadAhead(100, size=_one)
    calls = []
    ra.offer("k", 10, lambda: calls.append(1) or 42)
    ra.offer("k", 10, lambda: calls.append(2) or 43)  # held already: not read again
    assert ra.wait_for_reads(30)
    assert ra.take("k") == 42
    assert ra.take("k") is None  # taken
    assert calls == [1] and ra.hits == 1
    ra.close()


def test_the_budget_pushes_out_the_oldest_and_refuses_what_never_fits():
    ra: ReadAhead[str] = ReadAhead(25, size=lambda r: 10)
    ra.offer("a", 10, lambda: "a")
    ra.offer("b", 10, lambda: "b")
    ra.offer("c", 10, lambda: "c")  # 30 > 25: "a" goes
    ra.offer("huge", 26, lambda: "huge")  # more than the whole budget: never read
    assert ra.wait_for_reads(30)
    assert ra.take("a") is None and ra.take("huge") is None
    assert ra.take("b") == "b" and ra.take("c") == "c"
    assert ra.dropped == 1
    ra.close()


def test_a_read_counts_what_its_result_holds():
    ra: ReadAhead[str] = ReadAhead(100, size=lambda r: 60)
    ra.offer("b", 10, lambda: "b")
    assert ra.wait_for_reads(30)  # read and recounted: 60 held
    ra.offer("c", 50, lambda: "c")  # 60 + 50 > 100: "b" goes
    assert ra.wait_for_reads(30)
    assert ra.take("b") is None and ra.take("c") == "c"
    ra.close()


def test_a_failed_read_is_none_and_the_caller_reads_itself():
    ra: ReadAhead[int] = ReadAhead(100, size=_one)

    def boom() -> int:
        raise OSError("disk")

    ra.offer("k", 1, boom)
    assert ra.wait_for_reads(30)
    assert ra.take("k") is None
    ra.close()


def test_ready_only_leaves_a_running_read_for_the_waiting_caller():
    ra: ReadAhead[int] = ReadAhead(100, size=_one, threads=1)
    go, started = threading.Event(), threading.Event()
    ra.offer("k", 1, lambda: started.set() or (go.wait(10) and 7))
    started.wait(10)
    ra.offer("queued", 1, lambda: 8)  # behind "k" on the one thread
    assert ra.take("k", ready_only=True) is None  # still reading: left in place
    assert ra.take("queued") is None  # not started: the caller reads it sooner itself
    go.set()
    assert ra.take("k") == 7  # running: waits for it
    ra.close()
    ra.offer("late", 1, lambda: 9)  # after close: nothing starts
    assert ra.take("late") is None
