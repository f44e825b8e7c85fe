"""Stand-ins tests share."""

import numpy as np


class FakeClock:
    """A clock the test moves by hand: ``clock.now += 10``."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class BagOfWords:
    """A stand-in sentence embedder: word counts hashed by the sum of their characters, normalised.

    Deterministic across processes (``hash(str)`` is salted per process, so a test's "nothing
    similar" collided in about one run in sixteen)."""

    def __call__(self, texts: list[str]) -> np.ndarray:
        vectors = np.zeros((len(texts), 64), np.float32)
        for i, text in enumerate(texts):
            for word in text.lower().split():
                vectors[i, sum(map(ord, word)) % 64] += 1
        return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-9)
