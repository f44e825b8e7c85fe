"""The ``moeless`` command line: thin commands over the engine in ``moeless/``."""
