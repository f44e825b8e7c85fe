"""The engine's version, recorded in every manifest and shown by ``moeless --version``."""

__version__ = "0.1.0"
