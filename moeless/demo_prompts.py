"""The project's own few demo prompts: the demo and tests work on a fresh clone without ../shared."""

DEMO_PROMPTS: tuple[str, ...] = (
    "The import statement searches for a module",
    "A list comprehension consists of brackets containing an expression",
    "Exceptions raised inside a with statement",
    "Serverless functions scale to zero when idle, so",
)
