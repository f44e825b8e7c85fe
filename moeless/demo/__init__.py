"""The embedded default end to end (``moeless demo``): its prompts and the steps between the parts."""

from moeless.demo.prompts import DEMO_PROMPTS

__all__ = ["DEMO_PROMPTS"]
