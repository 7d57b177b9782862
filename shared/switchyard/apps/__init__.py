"""Classification applications: their registry, datasets, model variants and profiles.

The first step of SneakPeek model selection. An *application* (a classification task
with a deadline and a lateness penalty) has several *variants* (models trading accuracy
for latency); the registry (:mod:`switchyard.apps.registry`) records each variant's
measured profile so that a scheduler can pick one per request.

- :mod:`~switchyard.apps.penalty`: the utility of a late answer (step, linear, sigmoid);
- :mod:`~switchyard.apps.registry`: the registry file's models, load and save;
- :mod:`~switchyard.apps.datasets`: three real applications from scikit-learn's bundled
  data, and request streams with a chosen class mix;
- :mod:`~switchyard.apps.variants`: train, predict with, save and load the variants;
- :mod:`~switchyard.apps.profiling`: measure variants, build the registry;
- :mod:`~cli.apps`: the ``switchyard apps`` command.

Importing this package loads neither torch nor scikit-learn: they are imported inside
the functions that train, load or profile a variant.
"""

from switchyard.apps.datasets import (
    DATASET_NAMES,
    Dataset,
    UnknownDatasetError,
    load_dataset,
    sample_stream,
)
from switchyard.apps.penalty import Penalty
from switchyard.apps.registry import (
    Application,
    ModelEntry,
    PenaltySpec,
    PipelineEntry,
    PriorSpec,
    Registry,
    RegistryError,
    ResourcesEntry,
    StageEntry,
    UnknownApplicationError,
    VariantProfile,
)
from switchyard.apps.registry_file import load_registry, save_registry
from switchyard.apps.variants import (
    VARIANT_NAMES,
    Variant,
    VariantFileError,
    load_variant,
    train_application,
)

__all__ = [
    "DATASET_NAMES",
    "VARIANT_NAMES",
    "Application",
    "Dataset",
    "ModelEntry",
    "Penalty",
    "PenaltySpec",
    "PipelineEntry",
    "PriorSpec",
    "Registry",
    "RegistryError",
    "ResourcesEntry",
    "StageEntry",
    "UnknownApplicationError",
    "UnknownDatasetError",
    "Variant",
    "VariantFileError",
    "VariantProfile",
    "load_dataset",
    "load_registry",
    "load_variant",
    "sample_stream",
    "save_registry",
    "train_application",
]
