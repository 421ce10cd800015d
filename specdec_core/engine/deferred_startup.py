"""Start-up work a server does after its ready line, while no request is waiting or running.

Each piece is needed for speed or for a feature, not for serving the first request, and each
made every start wait: the rest of a first start's calibration (20-25 s of the default pair's
first start on the 2-core machine) or a later start's warm-up of the step shapes (up to 5 s;
``engine.startup_costs``), and llguidance's view of the tokenizer, which holds the GIL for its
whole build (2.5-3.5 s for Gemma 3's 262,144 tokens: built on a background thread before ready,
it stalled the engine thread's last steps and the event loop's ready line alike). Done while idle,
a request that arrives waits for at most one piece: a forward, or that one build.

An engine that is not a server's (tests, tools: ``work_when_idle`` off) does it all before it is
built, except the tokenizer view, which it starts on a background thread (``GrammarCompiler.warm``).
"""

from __future__ import annotations

import logging

from specdec_core.decoding.grammar import GrammarCompiler
from specdec_core.engine.scheduler import Scheduler
from specdec_core.engine.startup_costs import EngineCosts
from specdec_core.loading.progress_log import phase

log = logging.getLogger("specdec.engine")


class DeferredStartup:
    """What is owed (``owed``) and the next piece of it (``run_one``)."""

    def __init__(self, scheduler: Scheduler, costs: EngineCosts, grammars: GrammarCompiler, when_idle: bool) -> None:
        self.scheduler, self.costs, self.grammars = scheduler, costs, grammars
        if not when_idle:
            grammars.warm()
        elif grammars.owed:
            log.info("llguidance's view of the tokenizer is built while the engine is idle")

    @property
    def owed(self) -> bool:
        return self.costs.pending is not None or self.grammars.owed

    def run_one(self) -> bool:
        """The next piece, if nothing waits; False when there was none to run."""
        if self.scheduler.has_work():
            return False
        if self.costs.idle_work():
            return True
        if not self.grammars.owed:
            return False
        with phase(log, "building llguidance's view of the tokenizer while idle"):
            self.grammars.build()
        return True
