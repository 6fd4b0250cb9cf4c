"""The progress line's arithmetic, at chosen instants (no sleeping)."""

from diffusion.progress import Progress, clock


def test_clock_formats_minutes_and_hours():
    assert [clock(s) for s in (0, 42.4, 725, 3723, -3)] == ["0:00", "0:42", "12:05", "1:02:03", "0:00"]


def test_the_eta_is_the_pace_so_far_times_the_steps_left():
    progress = Progress("iteration", 10, now=100.0)
    assert progress.line(0, now=100.0) == "iteration  0/10 (  0%)  0:00 elapsed"
    # 3 steps in 30 s: 10 s each, 7 left
    assert progress.line(3, now=130.0) == "iteration  3/10 ( 30%)  0:30 elapsed, ETA 1:10"
    assert progress.line(10, now=200.0) == "iteration 10/10 (100%)  1:40 elapsed, done"


def test_a_resumed_loop_paces_only_the_steps_it_ran():
    progress = Progress("iteration", 40, done=20, now=0.0)
    assert progress.line(20, now=5.0) == "iteration 20/40 ( 50%)  0:05 elapsed"
    # 2 steps of this process in 60 s: 30 s each, 18 left (the 20 earlier steps do not count)
    assert progress.line(22, now=60.0) == "iteration 22/40 ( 55%)  1:00 elapsed, ETA 9:00"
