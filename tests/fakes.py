"""Stand-ins tests share."""


class FakeClock:
    """A clock the test moves by hand: ``clock.now += 10``."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
