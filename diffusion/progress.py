"""Progress of a loop of known length, with an ETA: `iteration 3/10 (30%)  0:42 elapsed, ETA 1:38`.

One line per step, not a redrawn bar: the lines read the same in a terminal, in `ray job logs` and in a
file. The ETA is the mean pace of the steps done in this process times the steps left (a resumed run's
earlier steps do not count: their pace is unknown here).
"""

from __future__ import annotations

import time


def clock(seconds: float) -> str:
    """0:42, 12:05, 1:02:03."""
    seconds = max(round(seconds), 0)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    def __init__(self, label: str, total: int, done: int = 0, now: float | None = None) -> None:
        self.label, self.total, self.first = label, total, done
        self.start = time.monotonic() if now is None else now

    def line(self, done: int, now: float | None = None) -> str:
        """The progress after `done` of `total` steps."""
        elapsed = (time.monotonic() if now is None else now) - self.start
        width = len(str(self.total))
        text = f"{self.label} {done:{width}d}/{self.total} ({100 * done / max(self.total, 1):3.0f}%)  {clock(elapsed)}"
        steps = done - self.first
        if done >= self.total:
            return text + " elapsed, done"
        if steps <= 0:
            return text + " elapsed"
        return text + f" elapsed, ETA {clock(elapsed / steps * (self.total - done))}"
