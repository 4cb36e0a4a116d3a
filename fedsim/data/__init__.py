"""Datasets and partitioners for fedsim, offline only.

Rules
-----
1. Nothing here downloads anything. Bundled data (scikit-learn digits) and
   generated data (FedProx Synthetic) need no files; LEAF, MNIST and
   CIFAR-10 are read from paths the caller gives.
2. Every random choice comes from an explicit seed through a
   ``numpy.random.Generator`` (never the global ``np.random``), so every
   process that calls :func:`build_federated` with the same arguments gets
   identical shards; :meth:`FederatedData.fingerprint` lets them check.

Entry point: :func:`build_federated`. The generator, loaders and
partitioners are public too, as pure functions.
"""

from fedsim.data._build import (
    DATASETS,
    PARTITIONS,
    build_federated,
    dataset_partitions,
    path_problem,
)
from fedsim.data._cifar import load_cifar10, load_cifar_batch
from fedsim.data._common import make_rng
from fedsim.data._digits import load_digits_arrays
from fedsim.data._federate import federate
from fedsim.data._holdout import HOLDOUTS, holdout_global, holdout_per_user
from fedsim.data._leaf import LEAF_VOCAB, LeafData, chars_to_indices, load_leaf
from fedsim.data._mnist import load_mnist, read_idx
from fedsim.data._partition import (
    DIRICHLET_PRIORS,
    DIRICHLET_RECIPES,
    partition_dirichlet,
    partition_iid,
    partition_shards,
)
from fedsim.data._synthetic import (
    SYNTHETIC_CLASSES,
    SYNTHETIC_DIM,
    SyntheticUsers,
    generate_synthetic,
)
from fedsim.data._types import ClientShard, FederatedData

__all__ = [
    "DATASETS",
    "DIRICHLET_PRIORS",
    "DIRICHLET_RECIPES",
    "HOLDOUTS",
    "LEAF_VOCAB",
    "PARTITIONS",
    "SYNTHETIC_CLASSES",
    "SYNTHETIC_DIM",
    "ClientShard",
    "FederatedData",
    "LeafData",
    "SyntheticUsers",
    "build_federated",
    "chars_to_indices",
    "dataset_partitions",
    "federate",
    "generate_synthetic",
    "holdout_global",
    "holdout_per_user",
    "load_cifar10",
    "load_cifar_batch",
    "load_digits_arrays",
    "load_leaf",
    "load_mnist",
    "make_rng",
    "partition_dirichlet",
    "partition_iid",
    "partition_shards",
    "path_problem",
    "read_idx",
]
