"""Errors a user can act on. The CLI prints their message as one line and exits non-zero."""


class MoelessError(Exception):
    """Base class: a problem with the user's input or environment, not a bug."""


class CheckpointError(MoelessError):
    """The model folder is missing, incomplete, corrupt or not a supported MoE checkpoint."""


class UnsupportedArchitectureError(CheckpointError):
    """The checkpoint is a model moeless cannot split (or not an MoE at all)."""


class PackagingError(MoelessError):
    """Exporting or writing artifacts failed (an expert failed verification, disk full...)."""


class ArtifactError(MoelessError):
    """Artifacts are missing, tampered with, or do not match their manifest."""


class PlanError(MoelessError):
    """A plan file is missing, malformed, or does not fit the artifacts it is used with."""


class PlanDoesNotFit(MoelessError):
    """The account's Lambda quotas cannot hold the plan; the message names each quota and the
    increase to ask for (:mod:`moeless.planning.quotas`)."""


class LambdaHostError(MoelessError):
    """The local Lambda host could not start its functions (port in use, provisioned init failed...)."""


class SimulationError(MoelessError):
    """A simulation asked of something it cannot replay (a malformed arrival spec, an unknown policy)."""


class ModelShapeError(MoelessError):
    """A model name or config.json that gives no whole-model shape (unknown, not an MoE, a key missing)."""


class CatalogueError(MoelessError):
    """An instance catalogue is malformed, or no fleet of it holds what is asked."""


class DraftModelError(MoelessError):
    """A draft model that cannot draft for the served model (another tokenizer, not a causal LM)."""
