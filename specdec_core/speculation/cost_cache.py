"""Step costs kept between starts: one small JSON file per (models, mode, machine, configuration).

Timing every step shape at start-up took ~16 s for the default pair on a quiet machine and 204 s
while another process used the CPU, and costs learned under load were wrong for the whole run.
So the costs are saved beside the converted weights (``<cache_dir>/step-costs/``) and a later
start with the same key loads them instead of timing anything. The key names everything that
changes what a step costs: the target and draft (``LoadedModel.identity``), the quantization mode (for
gguf, with the kernels' build),
attention layout, dtype and device, the machine (CPU model, torch's thread count, torch version,
the GPU's name) and the configuration that shapes steps (``max_num_seqs``, drafts per request,
``max_model_len``, the draft vocabulary). A different key is a different file: nothing stale is
ever read for another configuration.

Once serving, real steps keep correcting the live tables (``StepCostModel.observe_*``) and the
engine hands them to ``save_later``, which writes them from a background thread at most every
``SAVE_INTERVAL_S`` (the step loop never waits on the disk), so the next start begins from what
the machine really did.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specdec_core.speculation.cost_table import SHAPE_BOUND, CostTable
from specdec_core.speculation.step_costs import StepCostModel

log = logging.getLogger("specdec.step_costs")

# 2: the live tables keep the measured shape (format 1's were corrected bucket by bucket);
# 3: and the cost of a row's cached tokens (``CostTable.per_context``);
# 4: and a prefill point at the end of each table (``calibration``: what a draft catch-up costs);
#    a table may also carry its sizes' ``correction``, added without a new format: a file without it
#    reads as 1 each;
# 5: and the cost of a request's cached tokens, once whatever its rows (``per_request_context``),
#    with the most requests a grid point was timed with (``grid_requests``)
FORMAT = 5
SAVE_INTERVAL_S = 60.0


def machine() -> dict[str, Any]:
    """What about this machine changes a step's cost (not its speed today: its kind)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {"cpu": cpu, "threads": torch.get_num_threads(), "torch": torch.__version__, "gpu": gpu}


@dataclass
class CostCache:
    """The cost file of one key (``key``: JSON-able fields, see module docstring)."""

    directory: Path
    key: dict[str, Any]

    def __post_init__(self) -> None:
        digest = hashlib.sha256(json.dumps(self.key, sort_keys=True).encode()).hexdigest()[:16]
        self.path = Path(self.directory) / "step-costs" / f"{digest}.json"
        self._last_save = time.monotonic()
        self._saving: threading.Thread | None = None

    def load(self) -> StepCostModel | None:
        """The saved costs of this key, or None (missing, unreadable or another key: logged)."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable step-cost cache %s: %s", self.path, exc)
            return None
        try:
            if data["format"] != FORMAT:
                log.warning("ignoring step-cost cache %s: format %s, this version reads %d (re-measuring)",
                            self.path, data["format"], FORMAT)
                return None
            if data["key"] != json.loads(json.dumps(self.key)):
                log.warning("ignoring step-cost cache %s: written for another configuration", self.path)
                return None
            target = _table(data["target"])
            draft_table = _table(data["draft"]) if data.get("draft") else None
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("ignoring malformed step-cost cache %s: %s", self.path, exc)
            return None
        if not _valid(target) or (draft_table is not None and not _valid(draft_table)):
            log.warning("ignoring step-cost cache %s: its tables are not positive and ordered", self.path)
            return None
        return StepCostModel(target, draft_table, observed_steps=int(data.get("observed_steps", 0)))

    def save(self, costs: StepCostModel) -> None:
        """Write the live tables now (atomically: a reader never sees half a file)."""
        self._write(_snapshot(self.key, costs))

    def save_later(self, costs: StepCostModel) -> None:
        """Called by the engine after real steps corrected ``costs``: writes them from a thread
        when ``SAVE_INTERVAL_S`` passed since the last write and no write is under way."""
        now = time.monotonic()
        if now - self._last_save < SAVE_INTERVAL_S or (self._saving is not None and self._saving.is_alive()):
            return
        self._last_save = now
        data = _snapshot(self.key, costs)  # copied here: the engine thread goes on changing the tables
        self._saving = threading.Thread(target=self._write, args=(data,), name="step-cost-cache", daemon=True)
        self._saving.start()

    def _write(self, data: dict[str, Any]) -> None:
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as exc:  # a read-only cache costs the next start a calibration, nothing more
            log.warning("could not save the step costs to %s: %s", self.path, exc)
            tmp.unlink(missing_ok=True)


def _table(data: dict[str, Any]) -> CostTable:
    return CostTable(list(data["sizes"]), [float(s) for s in data["seconds"]], float(data["per_context"]),
                     int(data["context"]), [float(c) for c in data.get("correction") or []],
                     float(data["per_request_context"]), int(data["grid_requests"]))


def _valid(table: CostTable) -> bool:
    return (bool(table.sizes) and len(table.sizes) == len(table.seconds) and table.sizes == sorted(set(table.sizes))
            and all(s > 0 for s in table.seconds) and table.per_context >= 0 and table.context >= 0
            and table.per_request_context >= 0 and table.grid_requests >= 0
            and len(table.correction) == len(table.sizes)
            and all(1 / SHAPE_BOUND <= c <= SHAPE_BOUND for c in table.correction))


def _snapshot(key: dict[str, Any], costs: StepCostModel) -> dict[str, Any]:
    def table(t: CostTable | None) -> dict[str, Any] | None:
        if t is None:
            return None
        return {"sizes": list(t.sizes), "seconds": list(t.seconds), "per_context": t.per_context, "context": t.context,
                "correction": list(t.correction), "per_request_context": t.per_request_context,
                "grid_requests": t.grid_requests}

    return {"format": FORMAT, "key": key, "observed_steps": costs.observed_steps,
            "target": table(costs.live_target), "draft": table(costs.live_draft)}
