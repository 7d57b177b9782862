"""A nearest-neighbour index over an application's training features (faiss).

SneakPeek's cheap model is k-nearest neighbours: the labels of the ``k`` training rows
closest (in squared L2 distance) to a request are the evidence about the class
frequencies near it. Three faiss indexes are offered:

* ``flat`` (``IndexFlatL2``): exact, brute force; the reference, and fast enough for a few
  thousand rows (24 requests against 1,500 rows of dimension 64: about 0.2-0.3 ms for
  the whole estimate on one core, see ``bench/estimator_bench.py``).
* ``ivf`` (``IndexIVFFlat``): k-means into ``nlist`` cells (default ``round(sqrt(n))``, at
  least 1, at most ``n``), searched in the ``nprobe`` nearest cells (default 8). The
  k-means draws come from ``seed``. A request whose probed cells hold fewer than ``k``
  rows is searched again over every cell, so it always gets ``k`` real neighbours.
* ``hnsw`` (``IndexHNSWFlat``): a graph of ``hnsw_m`` (default 32) links per node,
  searched with ``efSearch = max(hnsw_ef_search, k)``. Its level draws use faiss's fixed
  internal seed; ``seed`` does not change it.

faiss runs on one OpenMP thread inside :meth:`NeighbourIndex.build` and
:meth:`NeighbourIndex.query_labels` (the previous setting is restored afterwards): the
same data and seed give the same index and the same neighbours, and request
batches this small are faster without a thread team.

faiss is imported inside the functions only: ``import switchyard.estimation`` does not
load it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Final, Literal, get_args

import numpy as np
from numpy.typing import ArrayLike, NDArray

from switchyard.estimation.errors import (
    EmptyTrainingSetError,
    FeatureDimensionError,
    LabelError,
    NeighbourCountError,
    NonFiniteFeatureError,
    UnknownIndexKindError,
)

if TYPE_CHECKING:
    import faiss

__all__ = [
    "DEFAULT_HNSW_EF_SEARCH",
    "DEFAULT_HNSW_M",
    "DEFAULT_NPROBE",
    "INDEX_KINDS",
    "IndexKind",
    "NeighbourIndex",
    "default_nlist",
]

IndexKind = Literal["flat", "ivf", "hnsw"]
INDEX_KINDS: Final[tuple[str, ...]] = get_args(IndexKind)
DEFAULT_NPROBE: Final = 8
DEFAULT_HNSW_M: Final = 32
DEFAULT_HNSW_EF_SEARCH: Final = 64


def default_nlist(n_rows: int) -> int:
    """Number of IVF cells for ``n_rows`` training rows: ``round(sqrt(n))``, at least 1.

    Example: 1,500 rows -> 39 cells; 1 row -> 1 cell.
    """
    return max(1, round(math.sqrt(n_rows)))


@contextmanager
def _one_thread(faiss_module: ModuleType) -> Iterator[None]:
    previous = int(faiss_module.omp_get_max_threads())
    faiss_module.omp_set_num_threads(1)
    try:
        yield
    finally:
        faiss_module.omp_set_num_threads(previous)


def _check_features(
    features: ArrayLike, *, name: str, dimension: int | None
) -> NDArray[np.float32]:
    """Return ``features`` as C-contiguous float32 ``[m, d]`` or raise a named error."""
    try:
        array = np.asarray(features, dtype=np.float32)
    except (TypeError, ValueError) as error:
        raise FeatureDimensionError(f"{name} must be a numeric [m, d] array: {error}") from None
    if array.ndim != 2:
        expected = f"[m, {dimension}]" if dimension is not None else "[n, d]"
        raise FeatureDimensionError(
            f"{name} must be a 2-D array of shape {expected}; got shape {array.shape}"
        )
    if dimension is not None and array.shape[1] != dimension:
        raise FeatureDimensionError(
            f"{name} has the wrong feature dimension: expected {dimension}, got {array.shape[1]}"
        )
    finite = np.isfinite(array)
    if not finite.all():
        row = int(np.flatnonzero(~finite.all(axis=1))[0])
        raise NonFiniteFeatureError(f"{name} row {row} holds NaN or an infinite value")
    return np.ascontiguousarray(array)


def _check_labels(labels: ArrayLike, n_rows: int) -> NDArray[np.int64]:
    array = np.asarray(labels)
    if array.ndim != 1 or array.shape[0] != n_rows:
        raise LabelError(
            f"labels must be a 1-D array with one label per training row ({n_rows}); "
            f"got shape {array.shape}"
        )
    if array.dtype.kind not in "iu":
        raise LabelError(f"labels must be integers; got dtype {array.dtype}")
    if np.any(array < 0):
        row = int(np.flatnonzero(array < 0)[0])
        raise LabelError(f"labels must be non-negative; row {row} has {int(array[row])}")
    result = array.astype(np.int64)
    result.setflags(write=False)
    return result


def _check_positive(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1; got {value!r}")
    return int(value)


@dataclass(frozen=True, eq=False, slots=True)
class NeighbourIndex:
    """Training features in a faiss index, with their labels; build with :meth:`build`.

    Attributes:
        kind: ``flat``, ``ivf`` or ``hnsw``.
        labels: label of each training row, int64 ``[n]``, read-only.
        dimension: number of feature columns ``d``.
        nlist: IVF cells (the ``ivf`` kind only; else 0).
        nprobe: IVF cells searched per request (the ``ivf`` kind only; else 0).
        hnsw_ef_search: HNSW search breadth (the ``hnsw`` kind only; else 0).
    """

    kind: IndexKind
    labels: NDArray[np.int64]
    dimension: int
    nlist: int
    nprobe: int
    hnsw_ef_search: int
    _index: faiss.Index

    @property
    def n_rows(self) -> int:
        """Number of training rows ``n``."""
        return int(self.labels.shape[0])

    @property
    def num_classes(self) -> int:
        """``1 + max(labels)``: the fewest classes a prior over these labels must have."""
        return int(self.labels.max()) + 1

    @classmethod
    def build(
        cls,
        features: ArrayLike,
        labels: ArrayLike,
        kind: str = "flat",
        *,
        nlist: int | None = None,
        nprobe: int = DEFAULT_NPROBE,
        hnsw_m: int = DEFAULT_HNSW_M,
        hnsw_ef_search: int = DEFAULT_HNSW_EF_SEARCH,
        seed: int = 0,
    ) -> NeighbourIndex:
        """Index ``features`` (float32-convertible ``[n, d]``) labelled by ``labels`` (``[n]``).

        Args:
            kind: ``flat`` (exact), ``ivf`` or ``hnsw`` (approximate).
            nlist: IVF cells; default :func:`default_nlist` (``round(sqrt(n))``), capped
                at ``n``.
            nprobe: IVF cells searched per request, capped at ``nlist``.
            hnsw_m: HNSW links per node.
            hnsw_ef_search: HNSW search breadth (raised to ``k`` at query time if lower).
            seed: seed of the IVF k-means (initial centroids and subsampling).

        Raises:
            EmptyTrainingSetError: ``n == 0`` or ``d == 0``.
            FeatureDimensionError: ``features`` is not 2-D.
            NonFiniteFeatureError: a row holds NaN or an infinity (the message names it).
            LabelError: labels are not ``n`` non-negative integers.
            UnknownIndexKindError: ``kind`` is not flat, ivf or hnsw.
            ValueError: ``nlist``, ``nprobe``, ``hnsw_m`` or ``hnsw_ef_search`` below 1.

        Example: ``NeighbourIndex.build(np.eye(3, dtype=np.float32), [0, 1, 1])`` then
        ``query_labels([[0.9, 0.1, 0.0]], k=1)`` is ``[[0]]``.
        """
        if kind not in INDEX_KINDS:
            raise UnknownIndexKindError(
                f"kind must be one of {', '.join(INDEX_KINDS)}; got {kind!r}"
            )
        array = _check_features(features, name="features", dimension=None)
        n_rows, dimension = array.shape
        if n_rows == 0 or dimension == 0:
            raise EmptyTrainingSetError(
                f"the training set is empty: features have shape {array.shape}; "
                "an index needs at least one row of at least one feature"
            )
        label_array = _check_labels(labels, n_rows)
        nprobe = _check_positive(nprobe, "nprobe")
        hnsw_m = _check_positive(hnsw_m, "hnsw_m")
        hnsw_ef_search = _check_positive(hnsw_ef_search, "hnsw_ef_search")
        cells = default_nlist(n_rows) if nlist is None else _check_positive(nlist, "nlist")
        cells = min(cells, n_rows)

        import faiss

        with _one_thread(faiss):
            index: faiss.Index
            if kind == "flat":
                index = faiss.IndexFlatL2(dimension)
            elif kind == "ivf":
                quantizer = faiss.IndexFlatL2(dimension)
                ivf = faiss.IndexIVFFlat(quantizer, dimension, cells)
                ivf.cp.seed = int(seed)
                ivf.cp.min_points_per_centroid = 1  # small sets: no stderr warning
                ivf.train(array)
                nprobe = min(nprobe, cells)
                ivf.nprobe = nprobe
                index = ivf
            else:
                hnsw = faiss.IndexHNSWFlat(dimension, hnsw_m)
                hnsw.hnsw.efSearch = hnsw_ef_search
                index = hnsw
            index.add(array)
        return cls(
            kind=kind,  # type: ignore[arg-type]  # checked against INDEX_KINDS above
            labels=label_array,
            dimension=dimension,
            nlist=cells if kind == "ivf" else 0,
            nprobe=nprobe if kind == "ivf" else 0,
            hnsw_ef_search=hnsw_ef_search if kind == "hnsw" else 0,
            _index=index,
        )

    def check_k(self, k: int) -> int:
        """Return ``k`` if ``1 <= k <= n_rows``, else raise :class:`NeighbourCountError`."""
        if isinstance(k, bool) or not isinstance(k, int | np.integer):
            raise NeighbourCountError(f"k must be an integer; got {k!r}")
        if not 1 <= k <= self.n_rows:
            raise NeighbourCountError(
                f"k must be between 1 and the number of training rows ({self.n_rows}); got {k}"
            )
        return int(k)

    def neighbour_rows(self, x: ArrayLike, k: int) -> NDArray[np.int64]:
        """Row numbers of the ``k`` nearest training rows of each request, ``[m, k]``.

        Nearest first. Raises :class:`FeatureDimensionError`,
        :class:`NonFiniteFeatureError` (naming the request row) or
        :class:`NeighbourCountError`.
        """
        k = self.check_k(k)
        queries = _check_features(x, name="x", dimension=self.dimension)
        if queries.shape[0] == 0:
            return np.empty((0, k), dtype=np.int64)
        import faiss

        with _one_thread(faiss):
            if self.kind == "hnsw":
                params = faiss.SearchParametersHNSW()  # type: ignore[attr-defined]  # not in the stubs
                params.efSearch = max(self.hnsw_ef_search, k)
                _, rows = self._index.search(queries, k, params=params)
            else:
                _, rows = self._index.search(queries, k)
            missing = np.flatnonzero((rows < 0).any(axis=1))
            if missing.size and self.kind == "ivf":
                every_cell = faiss.SearchParametersIVF()
                every_cell.nprobe = self.nlist
                _, again = self._index.search(queries[missing], k, params=every_cell)
                rows[missing] = again
        if (rows < 0).any():  # pragma: no cover - faiss returns k rows when k <= n
            raise RuntimeError(f"the {self.kind} index returned fewer than k={k} neighbours")
        return rows

    def query_labels(self, x: ArrayLike, k: int) -> NDArray[np.int64]:
        """Labels of the ``k`` nearest training rows of each request, int64 ``[m, k]``.

        Args:
            x: request features, ``[m, d]`` with the index's ``d``; ``m`` may be 0.
            k: neighbours per request, ``1 <= k <= n_rows``.

        Example: training rows ``[0,0], [1,0], [5,5]`` labelled ``0, 0, 1``; the request
        ``[0.2, 0]`` with ``k=2`` gets ``[[0, 0]]``, and ``[4, 4]`` gets ``[[1, 0]]``
        (nearest first).
        """
        return self.labels[self.neighbour_rows(x, k)]
