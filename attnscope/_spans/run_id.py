"""The run id a step's trace ids hash (docs/live.md), decided on the worker thread.

In order: the ``run_id`` setting; torchrun's ``$TORCHELASTIC_RUN_ID`` with its restart count
(``--standalone`` makes a fresh one per job, ``--rdzv-id X`` passes X); else, once
``torch.distributed`` is initialised with more than one rank, an id the ranks agree on through
the default process group's store; else a random id of this process (its steps do not join the
other ranks', and a warning says so once).

Why the store: a plain ``torchrun --nproc-per-node N`` sets ``TORCHELASTIC_RUN_ID=none`` in every
job, and nothing else in the environment tells one job from the next on the same port. The store
is the one thing every rank of a job shares and the next job does not: torchrun's agent (and an
``env://`` rank 0) starts a new one per job. The first rank to ask puts a fresh UUID under
``attnscope/run_id/<restart count>`` with ``compare_set`` (a restarted worker group asks under a
key of its own) and every later rank reads that one back: no rank waits for another (rank 0 may
not have reached a step yet), and a rank that never declares a step costs nothing.

Asked once per process, on the worker thread only (``StepTraces`` runs nowhere else), from a
short-lived helper thread the worker waits for at most ``AGREE_TIMEOUT_S``: a store that hangs
(its server gone quiet) delays span building once by that long, never the calling thread, and the
answer — an id, or a failure — is remembered. A step handled before ``init_process_group``
returns gets this process's own id (asked again at the next step).
"""

from __future__ import annotations

import os
import sys
import threading
import uuid
from collections.abc import Callable
from typing import Any

from .. import _dist, _log

__all__ = ["AGREE_TIMEOUT_S", "STORE_KEY", "RunId", "default_store"]

STORE_KEY = "attnscope/run_id/"  # + TORCHELASTIC_RESTART_COUNT: a restart never reuses an id
AGREE_TIMEOUT_S = 5.0  # one store round trip takes well under a millisecond
_MAX_ID_CHARS = 128


def default_store() -> Any | None:
    """The default process group's store, or None while torch.distributed is not initialised
    (or has one rank: nothing to agree with). Raises when the store cannot be reached."""
    dist: Any = sys.modules.get("torch.distributed")  # not imported: not initialised either
    if dist is None or not (dist.is_available() and dist.is_initialized()):
        return None
    if dist.get_world_size() <= 1:
        return None
    return dist.distributed_c10d._get_default_store()


class RunId:
    """Called when a step starts (on the worker): the run id its trace ids hash."""

    def __init__(self, configured: Callable[[], str | None],
                 store: Callable[[], Any | None] | None = None) -> None:
        self._configured = configured
        self._store = store or default_store
        self.own = uuid.uuid4().hex  # no shared id: this process's steps, one trace each
        self._agreed: str | None = None
        self._failed = False

    def __call__(self) -> str:
        run_id = self._configured() or self._agreed
        if run_id is not None:
            return run_id
        if not self._failed:
            run_id = self._agree()
            if run_id is not None:
                return run_id
        if not self._failed and _dist.world_size() > 1:  # a failure said why already
            _log.warn_once("step-run-id", "attnscope: no run id shared by the ranks (call "
                           "torch.distributed.init_process_group before the first step, set "
                           "ATTNSCOPE_RUN_ID or configure(run_id=...), or start with torchrun "
                           "--rdzv-id); each rank's steps get traces of their own")
        return self.own

    def _agree(self) -> str | None:
        """The id in the store (put there by this rank if it is the first to ask), or None."""
        try:
            store = self._store()
        except Exception as exc:  # noqa: BLE001  (whatever torch raises: fall back, say why)
            self._fail(f"no store: {type(exc).__name__}")
            return None
        if store is None:
            return None  # not initialised (yet): ask again at the next step
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "").strip() or "0"
        answer: list[Any] = []

        def ask() -> None:  # the helper thread: a hung store keeps it, not the worker
            try:
                answer.append(store.compare_set(STORE_KEY + restart, "", uuid.uuid4().hex))
            except Exception as exc:  # noqa: BLE001  (handed to the worker, which says why)
                answer.append(exc)

        helper = threading.Thread(target=ask, name="attnscope-run-id", daemon=True)
        try:
            helper.start()
        except RuntimeError:  # at interpreter shutdown (3.12+): no new thread
            self._fail("no thread at exit")
            return None
        helper.join(AGREE_TIMEOUT_S)
        if not answer:
            self._fail(f"no answer within {AGREE_TIMEOUT_S:g} s")
            return None
        value = answer[0]
        run_id = value.decode("ascii", "replace") if isinstance(value, bytes) else ""
        if not (0 < len(run_id) <= _MAX_ID_CHARS and run_id.isprintable()):
            self._fail(type(value).__name__ if isinstance(value, Exception)
                       else "the store holds no usable id")
            return None
        self._agreed = run_id
        _log.debug_once("step-run-id-agreed", "attnscope: run id agreed through the process "
                        "group's store", run_id=run_id)
        return run_id

    def _fail(self, reason: str) -> None:
        self._failed = True
        _log.warn_once("step-run-id-store", "attnscope: the ranks could not agree on a run id "
                       "through torch.distributed's store; each rank's steps get traces of their "
                       "own (set ATTNSCOPE_RUN_ID or configure(run_id=...))", reason=reason)
