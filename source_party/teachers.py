"""PATE teachers on the source: disjoint parts, one scikit-learn model each, vote counts.

The partition is given: each record's teacher comes from a keyed hash of its stable record id
(``teacher_assignment``), so it does not depend on the data or on the number of rows, each
record sits in exactly one part, and adding, removing or replacing one record changes at most one
teacher's vote: the sensitivity ``dpda.dp.pate`` accounts for. A teacher whose part is empty
always votes for class 0 (a data-independent vote). Vote counts never leave this module's caller
except through ``dpda.dp.pate.noisy_argmax``. Trained ensembles are shared by the sessions that
would train the same ones (``TeacherCache``, bounded).
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression


def teacher_assignment(n_rows: int, n_teachers: int, key: bytes) -> np.ndarray:
    """Teacher of each record: a keyed hash (HMAC-SHA256) of its stable record id (its index
    in the source's dataset) modulo T. Adding, removing or replacing one record moves exactly
    that record's teacher, never a boundary between parts (``array_split`` of a permutation
    shifted the boundaries when n changed, moving two teachers)."""
    out = np.empty(n_rows, dtype=np.int64)
    for i in range(n_rows):
        h = hmac.new(key, i.to_bytes(8, "little"), hashlib.sha256).digest()
        out[i] = int.from_bytes(h[:8], "little") % n_teachers
    return out


class _Constant:
    """A teacher whose part holds a single class."""

    def __init__(self, label: int) -> None:
        self.label = label

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.full(x.shape[0], self.label, dtype=np.int64)


class TeacherEnsemble:
    def __init__(
        self,
        x: np.ndarray,
        y: np.ndarray,
        parts: np.ndarray,
        n_teachers: int,
        n_classes: int,
    ) -> None:
        if not (1 <= n_teachers <= x.shape[0]):
            raise ValueError("the number of teachers must lie between 1 and the number of rows")
        if (
            parts.shape != (x.shape[0],)
            or parts.min(initial=0) < 0
            or parts.max(initial=0) >= n_teachers
        ):
            raise ValueError("every record needs a teacher in [0, n_teachers)")
        self.n_classes = n_classes
        self.dim = x.shape[1]
        self.teachers: list[object] = []
        for t in range(n_teachers):
            part = np.flatnonzero(parts == t)
            labels = y[part]
            if part.size == 0 or np.unique(labels).size == 1:
                self.teachers.append(_Constant(int(labels[0]) if part.size else 0))
                continue
            clf = LogisticRegression(max_iter=500, C=1.0)
            with warnings.catch_warnings():  # an unconverged teacher still votes; its vote is
                warnings.simplefilter("ignore", ConvergenceWarning)  # what the noise protects
                clf.fit(x[part], labels)
            self.teachers.append(clf)

    def votes(self, queries: np.ndarray) -> np.ndarray:
        """``(n, q)`` vote counts of the teachers on ``queries (n, d)``."""
        counts = np.zeros((queries.shape[0], self.n_classes), dtype=np.int64)
        rows = np.arange(queries.shape[0])
        for t in self.teachers:
            pred = np.asarray(t.predict(queries), dtype=np.int64)  # type: ignore[attr-defined]
            np.add.at(counts, (rows, pred), 1)
        return counts

    @property
    def nbytes(self) -> int:
        """Memory the teachers hold, roughly: their coefficient arrays and a fixed overhead
        per model (what ``TeacherCache`` bounds)."""
        total = 0
        for t in self.teachers:
            total += TEACHER_OVERHEAD_BYTES
            for name in ("coef_", "intercept_", "classes_", "n_iter_"):
                arr = getattr(t, name, None)
                if isinstance(arr, np.ndarray):
                    total += arr.nbytes
        return total


# a model's Python objects and attributes beside its arrays (a LogisticRegression, its params)
TEACHER_OVERHEAD_BYTES = 2048
TEACHER_CACHE_ENTRIES = 8
TEACHER_CACHE_BYTES = 256 << 20


@dataclass
class _Flight:
    """One training in progress: the threads that want the same teachers wait for it."""

    done: threading.Event = field(default_factory=threading.Event)
    value: TeacherEnsemble | None = None


class TeacherCache:
    """Trained teachers shared by the sessions of one dataset, keyed by everything they depend
    on besides the dataset itself: the feature map (the target's scaling, and in the projected
    space its basis), the number of teachers and classes. The partition is one data-independent
    keyed hash per releaser, so it is the same for every key.

    Why sharing is private: a teacher ensemble is a deterministic function of the private rows
    under a partition drawn independently of them, and it never leaves the source. What leaves
    is the noisy arg-max of its vote counts, and every answer is charged on the dataset's
    ledger with the data-independent event of ``dpda.dp.pate`` (one record moves one teacher's
    vote, whichever session asks). Answers of many sessions from the same teachers are then an
    adaptive composition of mechanisms on the same dataset, which the ledger composes; training
    them once or once per session releases the same thing.

    Bounded: at most ``max_entries`` ensembles and ``max_bytes`` of them (``nbytes``), least
    recently used out first; an ensemble larger than ``max_bytes`` is returned and not kept. A
    peer that sends many distinct bases evicts, and pays for its trainings from its CPU budget;
    it cannot grow the cache. Single-flight: threads asking for the same key while it trains
    wait for that training rather than start another; different keys train concurrently.
    ``trainings`` counts the ensembles this cache built."""

    def __init__(
        self, max_entries: int = TEACHER_CACHE_ENTRIES, max_bytes: int = TEACHER_CACHE_BYTES
    ) -> None:
        if max_entries < 0 or max_bytes < 0:
            raise ValueError("the cache's bounds must be ≥ 0")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.trainings = 0
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, TeacherEnsemble] = OrderedDict()
        self._sizes: dict[Hashable, int] = {}  # key → its ensemble's ``nbytes``
        self._flights: dict[Hashable, _Flight] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(self._sizes.values())

    def get(self, key: Hashable, build: Callable[[], TeacherEnsemble]) -> TeacherEnsemble:
        """The ensemble of ``key``: cached, or the one another thread is training, or built now
        by ``build`` (outside the cache's lock)."""
        while True:
            with self._lock:
                hit = self._entries.get(key)
                if hit is not None:
                    self._entries.move_to_end(key)
                    return hit
                flight = self._flights.get(key)
                mine = flight is None
                if flight is None:
                    flight = self._flights[key] = _Flight()
            if not mine:
                flight.done.wait()
                if flight.value is not None:
                    return flight.value
                continue  # that training failed: try again (and report its own failure)
            try:
                ens = build()
            except BaseException:
                with self._lock:
                    self._flights.pop(key, None)
                flight.done.set()
                raise
            with self._lock:
                self.trainings += 1
                self._keep(key, ens)
                self._flights.pop(key, None)
            flight.value = ens
            flight.done.set()
            return ens

    def _keep(self, key: Hashable, ens: TeacherEnsemble) -> None:
        size = ens.nbytes
        if self.max_entries < 1 or size > self.max_bytes:
            return
        self._entries[key] = ens
        self._sizes[key] = size
        while len(self._entries) > self.max_entries or sum(self._sizes.values()) > self.max_bytes:
            old, _ = self._entries.popitem(last=False)
            del self._sizes[old]
