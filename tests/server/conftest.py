"""Fixtures of the server tests beyond the shared ones in tests/conftest.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.servers import KEYED_API_KEY, KEYED_ORIGIN, KEYED_STORE_ENTRIES, ServerProcess, shared_server, stop_shared, tiny_args


@pytest.fixture(scope="session")
def keyed_server(tiny_target: Path, tiny_draft: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The tiny pair with an API key (``KEYED_API_KEY``), a store of ``KEYED_STORE_ENTRIES``
    responses, CORS for ``KEYED_ORIGIN`` and the draft model as its proposer: one process shared by
    the Responses, Messages, CORS and chat-page tests (none of them changes what another reads)."""
    args = tiny_args(tiny_target, tiny_draft, "--responses-store-entries", str(KEYED_STORE_ENTRIES),
                     "--allowed-origins", f"{KEYED_ORIGIN},http://other.example", "--allowed-methods", "GET,POST",
                     "--speculative-method", "draft")
    yield shared_server("keyed-small-store", args, tmp_path_factory.getbasetemp(), env={"SPECDEC_API_KEY": KEYED_API_KEY})
    stop_shared("keyed-small-store")
