"""The errors every model-loading path raises; their own module so that ``loader`` and
``default_models`` both import them at the top without importing each other in a cycle."""

from __future__ import annotations

# A field or value in a message is cut to this many characters: a message stays one short line
# whatever a file holds (a chat template, a 1 MB string, a key with newlines in it).
_SHOWN_CHARS = 120


class ModelLoadError(RuntimeError):
    """A model could not be found or loaded; the message says which path or id and why."""


class ModelFileError(ModelLoadError):
    """A model file is malformed, or does not describe the model its metadata claims.

    Its own class because model files come from strangers: a bad one is the user's input, not a
    fault of the installation, so the server reports it as one line and exits 2 (``server.app``)
    instead of logging a traceback. The message names the file, the field (a metadata key, a
    tensor, a count of the header), what was expected and what was found, on one line.
    """

    def __init__(self, file: str, field: str, expected: str, found: object) -> None:
        self.file, self.field, self.expected, self.found = file, field, expected, found
        super().__init__(f"{shown(file)}: {shown(field)}: expected {expected}, found {shown(found)}")

    def __reduce__(self):  # keyword-free arguments: picklable across processes (Ray replicas)
        return type(self), (self.file, self.field, self.expected, self.found)


def shown(value: object) -> str:
    """``value`` for a one-line message: bytes repr'd, every unprintable character escaped (a
    file's own strings may hold newlines and terminal escapes), cut short."""
    text = repr(value) if isinstance(value, bytes) else str(value)
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS - 3] + "..."
