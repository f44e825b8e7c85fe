"""The project's own demo prompts: the demo and tests work on a fresh clone without ../shared.

Written for the demo model, which is trained on Python's documentation; the last few are about
this project, so that Similar-Prompt Search sees prompts that are not alike too.
"""

DEMO_PROMPTS: tuple[str, ...] = (
    "The import statement searches for a module",
    "A list comprehension consists of brackets containing an expression",
    "Exceptions raised inside a with statement",
    "Serverless functions scale to zero when idle, so",
    "The dictionary keys must be hashable, which means",
    "A generator function returns an iterator that",
    "The global interpreter lock prevents",
    "Decorators wrap a function and return",
    "The os.path module provides functions to",
    "A class may define a method named __init__ that",
    "The socket module gives access to",
    "Regular expressions in the re module match",
    "Threads share memory, while processes",
    "The json module encodes Python objects as",
    "A mixture of experts routes each token to",
    "Provisioned concurrency keeps instances warm so that",
)
