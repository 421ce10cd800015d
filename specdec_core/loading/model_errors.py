"""The error every model-loading path raises; its own module so that ``loader`` and
``default_models`` both import it at the top without importing each other in a cycle."""

from __future__ import annotations


class ModelLoadError(RuntimeError):
    """A model could not be found or loaded; the message says which path or id and why."""
