"""SneakPeek: data-aware accuracy estimation for model selection.

A cheap k-nearest-neighbour model over an application's training data
(:class:`NeighbourIndex`, faiss) gives multinomial evidence about the class frequencies
near a request; a Dirichlet prior (:func:`dirichlet_alpha`: Jeffreys by default, weak or
strong informative) turns it into posterior class frequencies ``theta``; each model
variant's expected accuracy on the request is ``sum_c theta_c * recall_c``
(:class:`SneakPeekEstimator`). The estimate itself is a zero-latency candidate answer
(``argmax theta``, right with probability :func:`sneakpeek_accuracy` = ``max theta``).
:func:`accuracy_mae` measures how well the estimates track real outcomes.

Pure numpy apart from the neighbour search. Importing this package does not import faiss.
"""

from switchyard.estimation.errors import (
    EmptyTrainingSetError,
    FeatureDimensionError,
    LabelError,
    NeighbourCountError,
    NonFiniteFeatureError,
    RecallError,
    SneakPeekError,
    UnknownIndexKindError,
)
from switchyard.estimation.estimator import (
    CONFIDENCE_THRESHOLD,
    Estimates,
    LabelSource,
    SneakPeekEstimator,
    class_counts,
    posterior_theta,
    sneakpeek_accuracy,
)
from switchyard.estimation.index import (
    DEFAULT_HNSW_EF_SEARCH,
    DEFAULT_HNSW_M,
    DEFAULT_NPROBE,
    INDEX_KINDS,
    IndexKind,
    NeighbourIndex,
    default_nlist,
)
from switchyard.estimation.prior import (
    DEFAULT_PRIOR,
    JEFFREYS_ALPHA,
    PRIOR_KINDS,
    STRONG_CONCENTRATION,
    PriorKind,
    dirichlet_alpha,
)
from switchyard.estimation.quality import AccuracyMae, accuracy_mae

__all__ = [
    "CONFIDENCE_THRESHOLD",
    "DEFAULT_HNSW_EF_SEARCH",
    "DEFAULT_HNSW_M",
    "DEFAULT_NPROBE",
    "DEFAULT_PRIOR",
    "INDEX_KINDS",
    "JEFFREYS_ALPHA",
    "PRIOR_KINDS",
    "STRONG_CONCENTRATION",
    "AccuracyMae",
    "EmptyTrainingSetError",
    "Estimates",
    "FeatureDimensionError",
    "IndexKind",
    "LabelError",
    "LabelSource",
    "NeighbourCountError",
    "NeighbourIndex",
    "NonFiniteFeatureError",
    "PriorKind",
    "RecallError",
    "SneakPeekError",
    "SneakPeekEstimator",
    "UnknownIndexKindError",
    "accuracy_mae",
    "class_counts",
    "default_nlist",
    "dirichlet_alpha",
    "posterior_theta",
    "sneakpeek_accuracy",
]
