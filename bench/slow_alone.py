"""A hostile guest's trick, for bench/torch_train.py --slow-alone: it goes slow whenever it runs
alone on the GPU.

The share controller reads a guest's rate alone by holding the others for a moment (a probe,
vmgpu/share_control.py); a guest that sees its steps come faster than they do beside the others
takes that for a probe and sleeps after each step, so that it is read at a part of its speed.
Were its rate alone then taken from what it does beside the others, it would look as fast as
alone, short of nothing, and be held by nobody (on the controller's model it took 35% of the GPU
at a weight of 10 beside 30 and 70).  No torch here: the decision alone, which the tests drive."""

from __future__ import annotations


class SlowAlone:
    """After each stretch of work that took `dt` seconds, how long to sleep: none while its
    stretches take about as long as they did beside the others (their running mean), and where
    one is quicker than `quicker` of that (the others held: alone), enough that it goes at `part`
    of its speed.  The mean is learned from the first `first` stretches and then from each
    stretch not taken for one alone."""

    def __init__(self, part: float, quicker: float = 0.7, learn: float = 0.1, first: int = 5):
        if not 0 < part <= 1:
            raise ValueError(f"--slow-alone {part}: a part of its speed, in (0, 1]")
        self.part, self.quicker, self.learn, self.first = part, quicker, learn, first
        self.beside = 0.0
        self.seen = 0
        self.alone = 0  # stretches taken for one alone

    def after(self, dt: float) -> float:
        if dt <= 0:
            return 0.0
        self.seen += 1
        if self.seen <= self.first:
            self.beside += (dt - self.beside) / self.seen
            return 0.0
        if dt < self.quicker * self.beside:
            self.alone += 1
            return dt * (1 / self.part - 1)
        self.beside += self.learn * (dt - self.beside)
        return 0.0
