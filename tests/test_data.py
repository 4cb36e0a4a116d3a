"""Tests for fedsim.data: generator, loaders, partitioners, build_federated.

Loader tests run on small files written here, in the real formats (IDX with
and without gzip, CIFAR batches as Python 2's cPickle wrote them, LEAF JSON),
plus the real FedProx Synthetic(1,1) test split in shared/data.
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import pickle
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from fedsim.data import (
    LEAF_VOCAB,
    build_federated,
    chars_to_indices,
    generate_synthetic,
    load_cifar10,
    load_cifar_batch,
    load_digits_arrays,
    load_leaf,
    load_mnist,
    make_rng,
    partition_dirichlet,
    partition_iid,
    partition_shards,
    read_idx,
)

REAL = Path(__file__).resolve().parents[2] / "shared" / "data"
REAL_SYNTHETIC = REAL / "fedprox-synthetic_1_1-test.json"
needs_real = pytest.mark.skipif(
    not REAL_SYNTHETIC.is_file(), reason="shared/data not beside the repository"
)


# --------------------------------------------------------------------------
# file writers for the real formats


def write_idx(path: Path, array: np.ndarray, *, gz: bool = False) -> Path:
    """Write ``array`` as an IDX file: uint8 as type 0x08, anything else as int32."""
    code, big_endian = (0x08, "u1") if array.dtype == np.uint8 else (0x0C, ">i4")
    header = bytes([0, 0, code, array.ndim]) + struct.pack(
        f">{array.ndim}I", *array.shape
    )
    raw = header + array.astype(big_endian).tobytes()
    path.write_bytes(gzip.compress(raw) if gz else raw)
    return path


def _p2_str(b: bytes) -> bytes:  # SHORT_BINSTRING / BINSTRING
    if len(b) < 256:
        return b"U" + bytes([len(b)]) + b
    return b"T" + struct.pack("<i", len(b)) + b


def _p2_int(v: int) -> bytes:  # BININT1 / BININT2 / BININT
    if 0 <= v < 256:
        return b"K" + bytes([v])
    if 0 <= v < 65536:
        return b"M" + struct.pack("<H", v)
    return b"J" + struct.pack("<i", v)


def py2_cifar_batch(data: np.ndarray, labels: list[int]) -> bytes:
    """A CIFAR batch pickled the way Python 2's cPickle (protocol 2) wrote it."""
    rows, cols = data.shape
    out = b"\x80\x02}(" + _p2_str(b"data")
    out += b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n"
    out += _p2_int(0) + b"\x85" + _p2_str(b"b") + b"\x87R"
    out += b"(" + _p2_int(1) + _p2_int(rows) + _p2_int(cols) + b"\x86"
    out += b"cnumpy\ndtype\n" + _p2_str(b"u1") + _p2_int(0) + _p2_int(1) + b"\x87R"
    out += b"(" + _p2_int(3) + _p2_str(b"|") + b"NNN" + _p2_int(-1) + _p2_int(-1)
    out += _p2_int(0) + b"tb"
    out += b"\x89" + _p2_str(data.astype(np.uint8).tobytes()) + b"tb"
    out += _p2_str(b"labels") + b"](" + b"".join(_p2_int(v) for v in labels) + b"e"
    out += _p2_str(b"batch_label") + _p2_str(b"training batch 1 of 5")
    return out + b"u."


def write_cifar_dir(
    root: Path, rng: np.random.Generator, per_batch: int = 4
) -> dict[str, tuple[np.ndarray, list[int]]]:
    """Write the six CIFAR-10 batch files; return what each holds."""
    root.mkdir(parents=True, exist_ok=True)
    written = {}
    for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]:
        data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, per_batch)]
        (root / name).write_bytes(py2_cifar_batch(data, labels))
        written[name] = (data, labels)
    return written


def leaf_blob(users: dict[str, tuple[list, list]]) -> dict:
    return {
        "users": list(users),
        "num_samples": [len(y) for _, y in users.values()],
        "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()},
    }


# --------------------------------------------------------------------------
# FedProx Synthetic(alpha, beta)


def test_synthetic_same_seed_identical_bit_for_bit() -> None:
    a = generate_synthetic(30, seed=7)
    b = generate_synthetic(30, seed=7)
    assert a.num_samples == b.num_samples
    for xa, xb, ya, yb in zip(a.x, b.x, a.y, b.y, strict=True):
        assert xa.dtype == np.float32
        assert ya.dtype == np.int64
        assert xa.tobytes() == xb.tobytes()
        assert ya.tobytes() == yb.tobytes()


def test_synthetic_different_seed_differs() -> None:
    a = generate_synthetic(30, seed=7)
    b = generate_synthetic(30, seed=8)
    assert a.num_samples != b.num_samples
    assert not np.array_equal(a.x[0][:10], b.x[0][:10])


def test_synthetic_recipe_shapes_sizes_and_split() -> None:
    data = generate_synthetic(40, seed=3)
    assert len(data.x) == 40
    assert data.users[0] == "f_00000"
    assert min(data.num_samples) >= 50  # int(lognormal) + 50
    assert data.num_samples == data.num_samples_uncapped
    for x, y, n in zip(data.x, data.y, data.num_samples, strict=True):
        assert x.shape == (n, 60)
        assert y.shape == (n,)
        assert y.min() >= 0
        assert y.max() <= 9
    fed = build_federated("synthetic", num_clients=40, partition="natural", seed=3)
    assert fed.meta["n_k"] == list(data.num_samples)
    assert [c.client_id for c in fed.clients] == list(data.users)
    # the authors' per-user 90/10 split: int(0.9 n) train, the rest test
    assert [c.num_samples for c in fed.clients] == [
        int(0.9 * n) for n in data.num_samples
    ]
    assert fed.test_y.shape[0] == sum(data.num_samples) - fed.num_train
    assert fed.input_shape == (60,)
    assert fed.num_classes == 10


def test_synthetic_cap_records_realized_sizes() -> None:
    capped = generate_synthetic(30, seed=1, n_cap=60)
    assert max(capped.num_samples) <= 60
    assert capped.num_samples == tuple(min(n, 60) for n in capped.num_samples_uncapped)
    assert max(capped.num_samples_uncapped) > 60


def test_synthetic_equal_sizes_give_every_user_the_same_count() -> None:
    """Delta-SGD's and FedAsync's papers give every client the same number of examples:
    ``n_equal`` (``data.synthetic_sizes = 500``) replaces the lognormal sizes, keeps the
    users' heterogeneity, and is seeded like the rest."""
    equal = generate_synthetic(20, seed=3, n_equal=500)
    assert equal.num_samples == (500,) * 20
    assert all(len(y) == 500 for y in equal.y)
    lognormal = generate_synthetic(20, seed=3)
    assert max(lognormal.num_samples) > 30_000        # seed 3's dominant user
    assert equal.num_samples_uncapped == lognormal.num_samples_uncapped
    assert generate_synthetic(20, seed=3, n_equal=500).x[0].tobytes() == equal.x[0].tobytes()
    # every user's labels still follow its own model: not one shared distribution
    tops = {int(np.bincount(y, minlength=10).argmax()) for y in equal.y}
    assert len(tops) > 3


def test_synthetic_sizes_key_reaches_the_generator() -> None:
    from fedsim.actors.setup import build_data
    from fedsim.scenario import parse

    sc = parse({"name": "x", "seed": 2, "data": {"dataset": "synthetic", "num_clients": 10,
                                                  "synthetic_sizes": 500}}, "x")
    assert [len(c.y) for c in build_data(sc).clients] == [450] * 10   # 10 % held out
    from fedsim.errors import ScenarioError
    with pytest.raises(ScenarioError, match="synthetic_sizes"):
        parse({"name": "x", "data": {"synthetic_sizes": "equal"}}, "x")


def test_synthetic_iid_variant_shares_the_label_distribution() -> None:
    # iid: one W, b for everybody and v_k = 0, so users' label histograms agree;
    # non-iid users each have their own dominant classes.
    def spread(data) -> float:
        big = [y for y in data.y if y.shape[0] >= 200]
        hists = [np.bincount(y, minlength=10) / y.shape[0] for y in big]
        return float(np.mean([0.5 * np.abs(h - hists[0]).sum() for h in hists[1:]]))

    assert spread(generate_synthetic(30, seed=2, iid=True)) < 0.15
    assert spread(generate_synthetic(30, seed=2)) > 0.5


@needs_real
def test_synthetic_matches_authors_test_split_statistics() -> None:
    """Compare with the FedProx authors' own Synthetic(1,1) test split.

    The real file is one draw, so each check is loose and compares like with
    like (our *test* splits of 30 users, pooled over 10 fixed seeds):

    - sizes: test sizes n - int(0.9 n) follow the same heavy-tailed law
      (two-sample KS test, p = 0.96 here; a lognormal(5, 2) recipe gives
      p = 0.002), both have minimum 5 and a max/median ratio far above 1;
    - label skew: almost all of a user's test labels fall in its top two
      classes (real 0.96, ours 0.98; uniform labels would give about 0.45);
    - features: within a user, Var(x_j) / j^-1.2 is about 1 (Sigma =
      diag(j^-1.2)), on the largest user of each.
    """
    real = load_leaf(REAL_SYNTHETIC)
    real_sizes = np.array(real.num_samples)

    def top2(ys: list[np.ndarray]) -> float:
        shares = [np.sort(np.bincount(y, minlength=10))[-2:].sum() / y.size for y in ys]
        return float(np.mean(shares))

    def var_ratio(x: np.ndarray) -> float:
        return float(np.median(x.var(axis=0) / np.arange(1, 61) ** -1.2))

    sizes, skews, ratios = [], [], []
    for seed in range(10):
        fed = build_federated(
            "synthetic", num_clients=30, partition="natural", seed=seed
        )
        n_k = np.array(fed.meta["n_k"])
        test_sizes = n_k - (0.9 * n_k).astype(int)
        sizes.extend(test_sizes)
        ratios.append(test_sizes.max() / np.median(test_sizes))
        bounds = np.concatenate(([0], np.cumsum(test_sizes)))
        skews.append(top2([fed.test_y[a:b] for a, b in itertools.pairwise(bounds)]))
    assert stats.ks_2samp(real_sizes, sizes).pvalue > 0.05
    assert real_sizes.min() == min(sizes) == 5
    assert real_sizes.max() / np.median(real_sizes) > 10
    assert np.median(ratios) > 5
    assert top2(list(real.y)) > 0.9
    assert np.mean(skews) > 0.9
    assert abs(np.mean(skews) - top2(list(real.y))) < 0.05
    ours = generate_synthetic(30, seed=0)
    largest = int(np.argmax(ours.num_samples))
    assert 0.8 < var_ratio(ours.x[largest]) < 1.25
    assert 0.8 < var_ratio(real.x[int(np.argmax(real_sizes))]) < 1.25


def test_synthetic_labels_in_batches_are_the_per_user_loops() -> None:
    """The batched labelling (start-up time at 10,000 users) does the same
    elementwise operations in the same order as the per-user loop: the logits,
    hence the labels, are bit for bit the same, whatever the users' sizes."""
    from fedsim.data._synthetic import _labels, _logits

    rng = np.random.default_rng(5)
    batch = [(rng.standard_normal((n, 60)), rng.normal(m, 1.0, (60, 10)), rng.normal(m, 1.0, 10))
             for n, m in [(1, 0.0), (7, 1.0), (300, -2.0), (3, 0.5), (50, 3.0)]]
    got = _labels(batch)
    assert len(got) == len(batch)
    for (x, w, b), labels in zip(batch, got, strict=True):
        assert labels.dtype == np.int64
        assert np.array_equal(labels, np.argmax(_logits(x, w, b), axis=1))


def test_synthetic_generation_is_fast() -> None:
    import time

    start = time.perf_counter()
    build_federated("synthetic", num_clients=100, partition="natural", seed=11)
    assert time.perf_counter() - start < 1.0


def test_synthetic_global_holdout_asyncfeded_style() -> None:
    fed = build_federated(
        "synthetic", num_clients=10, partition="natural", seed=4, holdout="global"
    )
    total = sum(fed.meta["n_k"])
    assert fed.test_y.shape[0] == round(0.1 * total)
    assert fed.num_train + fed.test_y.shape[0] == total


def test_build_is_identical_across_processes() -> None:
    """Server and client hosts rebuild the data independently: same bytes."""
    calls = [
        ("synthetic", 30, "natural", 3, {}),
        ("digits", 12, "dirichlet", 1, {"dirichlet_alpha": 0.3}),
        (
            "digits",
            12,
            "dirichlet",
            1,
            {"dirichlet_alpha": 0.3, "recipe": "feddyn_sequential"},
        ),
        ("digits", 10, "shards", 2, {}),
    ]
    script = (
        "import json, sys\nfrom fedsim.data import build_federated\n"
        "for d, n, p, s, o in json.loads(sys.argv[1]):\n"
        "    print(build_federated(d, num_clients=n, partition=p, seed=s, **o)"
        ".fingerprint())\n"
    )
    env = {
        **os.environ,
        "PYTHONHASHSEED": "12345",
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
    }
    out = subprocess.run(
        [sys.executable, "-W", "error", "-c", script, json.dumps(calls)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=60,
    ).stdout.split()
    here = [
        build_federated(d, num_clients=n, partition=p, seed=s, **o).fingerprint()
        for d, n, p, s, o in calls
    ]
    assert out == here


# --------------------------------------------------------------------------
# LEAF JSON


@needs_real
def test_leaf_loader_on_the_real_fedprox_file() -> None:
    data = load_leaf(REAL_SYNTHETIC)
    assert len(data.users) == 30
    assert sum(data.num_samples) == 1084
    assert not data.is_text
    assert data.users[0] == "f_00000"
    assert all(x.shape[1:] == (60,) and x.dtype == np.float32 for x in data.x)
    y = np.concatenate(data.y)
    assert y.dtype == np.int64
    assert set(np.unique(y)) <= set(range(10))
    counts = np.bincount(y, minlength=10)
    assert (counts[7] + counts[8]) / y.size == pytest.approx(0.65, abs=0.01)
    fed = build_federated(
        "leaf", num_clients=30, partition="natural", seed=0, path=str(REAL_SYNTHETIC)
    )
    assert fed.num_train + fed.test_y.shape[0] == 1084
    assert fed.input_shape == (60,)
    assert fed.num_classes == 10
    sub = build_federated(
        "leaf", num_clients=10, partition="natural", seed=5, path=REAL_SYNTHETIC
    )
    ids = [c.client_id for c in sub.clients]
    assert len(ids) == 10
    assert ids == sorted(ids)
    with pytest.raises(ValueError, match=r"num_clients: 31.*30 users"):
        build_federated(
            "leaf", num_clients=31, partition="natural", seed=0, path=REAL_SYNTHETIC
        )


def test_leaf_directory_with_test_path(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)

    def user(n: int) -> tuple[list, list]:
        return rng.normal(size=(n, 4)).tolist(), [
            float(v) for v in rng.integers(0, 3, n)
        ]

    train, test = tmp_path / "train", tmp_path / "test"
    train.mkdir()
    test.mkdir()
    (train / "b.json").write_text(json.dumps(leaf_blob({"u2": user(5), "u3": user(6)})))
    (train / "a.json").write_text(json.dumps(leaf_blob({"u1": user(4)})))
    (train / "notes.txt").write_text("ignored")
    (test / "all.json").write_text(
        json.dumps(leaf_blob({"u1": user(2), "u3": user(1)}))
    )
    data = load_leaf(train)
    assert data.users == ("u1", "u2", "u3")
    assert data.files == ("a.json", "b.json")
    fed = build_federated(
        "leaf",
        num_clients=3,
        partition="natural",
        seed=0,
        path=train,
        test_path=test,
        input_shape=[2, 2],
    )
    assert [c.num_samples for c in fed.clients] == [4, 5, 6]
    assert fed.test_y.shape == (3,)
    assert fed.input_shape == (2, 2)
    with pytest.raises(ValueError, match="test_path"):
        build_federated(
            "leaf",
            num_clients=3,
            partition="natural",
            seed=0,
            path=train,
            test_path=test,
            holdout="global",
        )


def test_leaf_shakespeare_characters(tmp_path: Path) -> None:
    blob = leaf_blob(
        {
            "ROMEO": (["to be", "or no", "t, th", "at is"], ["t", " ", "a", " "]),
            "JULIET": (["Hey!\n", "O Rom", "eo, R"], ["}", "e", "o"]),
        }
    )
    path = tmp_path / "shakespeare.json"
    path.write_text(json.dumps(blob))
    data = load_leaf(path)
    assert data.is_text
    assert len(LEAF_VOCAB) == 80
    assert data.x[0][0].tolist() == chars_to_indices("to be").tolist()
    assert LEAF_VOCAB[int(data.y[1][0])] == "}"
    fed = build_federated("leaf", num_clients=2, partition="natural", seed=0, path=path)
    assert fed.num_classes == 80
    assert fed.input_shape == (5,)
    assert [c.num_samples for c in fed.clients] == [3, 2]
    assert fed.test_y.shape == (2,)
    with pytest.raises(ValueError, match="'~'"):
        chars_to_indices("a~b")


@pytest.mark.parametrize(
    ("blob", "match"),
    [
        ({"users": ["a"], "user_data": {}}, "no user_data for 'a'"),
        (
            {
                "users": ["a"],
                "num_samples": [3],
                "user_data": {"a": {"x": [[1.0]], "y": [0]}},
            },
            "num_samples says 3",
        ),
        ({"users": ["a"], "user_data": {"a": {"x": [[1.0]], "y": [0.5]}}}, "integers"),
        ({"user": []}, "needs 'users'"),
    ],
)
def test_leaf_rejects_malformed_files(tmp_path: Path, blob: dict, match: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(blob))
    with pytest.raises(ValueError, match=match):
        load_leaf(path)


def test_leaf_rejects_duplicate_users_and_missing_paths(tmp_path: Path) -> None:
    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text(json.dumps(leaf_blob({"u": ([[1.0]], [0])})))
    with pytest.raises(ValueError, match="'u' appears in both"):
        load_leaf(tmp_path)
    with pytest.raises(FileNotFoundError):
        load_leaf(tmp_path / "missing")


# --------------------------------------------------------------------------
# MNIST IDX and CIFAR-10 batches


def test_mnist_idx_loader_plain_and_gz(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    xtr = rng.integers(0, 256, (20, 28, 28), dtype=np.uint8)
    ytr = rng.integers(0, 10, 20).astype(np.uint8)
    xte = rng.integers(0, 256, (6, 28, 28), dtype=np.uint8)
    yte = rng.integers(0, 10, 6).astype(np.uint8)
    write_idx(tmp_path / "train-images-idx3-ubyte.gz", xtr, gz=True)
    write_idx(tmp_path / "train-labels-idx1-ubyte", ytr)
    write_idx(tmp_path / "t10k-images-idx3-ubyte", xte)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", yte, gz=True)
    a, b, c, d = load_mnist(tmp_path)
    assert np.array_equal(a, xtr)
    assert np.array_equal(b, ytr)
    assert b.dtype == np.int64
    assert np.array_equal(c, xte)
    assert np.array_equal(d, yte)
    ints = np.arange(-3, 3, dtype=">i4").reshape(2, 3)
    assert np.array_equal(read_idx(write_idx(tmp_path / "ints.idx", ints)), ints)
    fed = build_federated(
        "mnist", num_clients=4, partition="iid", seed=0, path=tmp_path
    )
    assert fed.input_shape == (1, 28, 28)
    assert fed.num_train == 20
    assert fed.test_x.shape == (6, 1, 28, 28)
    assert fed.test_x.min() >= 0.0
    assert fed.test_x.max() <= 1.0
    assert np.allclose(fed.test_x[:, 0] * 255, xte)
    flat = build_federated(
        "mnist", num_clients=4, partition="iid", seed=0, path=tmp_path, flatten=True
    )
    assert flat.input_shape == (784,)


def test_mnist_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad-idx"
    bad.write_bytes(b"\x00\x00\x08\x01" + struct.pack(">I", 10) + b"\x00" * 3)
    with pytest.raises(ValueError, match="needs 10 bytes"):
        read_idx(bad)
    bad.write_bytes(b"\x01\x02\x08\x01")
    with pytest.raises(ValueError, match="magic"):
        read_idx(bad)
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte"):
        load_mnist(tmp_path)


def test_cifar10_python2_batches(tmp_path: Path) -> None:
    root = tmp_path / "cifar-10-batches-py"
    written = write_cifar_dir(root, np.random.default_rng(2))
    x, y = load_cifar_batch(root / "data_batch_1")
    assert x.shape == (4, 3, 32, 32)
    assert x.dtype == np.uint8
    assert y.dtype == np.int64
    data, labels = written["data_batch_1"]
    assert y.tolist() == labels
    # channel-major rows: the first 1024 bytes are the red plane, row by row
    assert np.array_equal(x[0, 0].ravel(), data[0, :1024])
    assert np.array_equal(x.reshape(4, -1), data)
    xtr, _ytr, xte, _yte = load_cifar10(tmp_path)  # the parent directory works too
    assert xtr.shape == (20, 3, 32, 32)
    assert xte.shape == (4, 3, 32, 32)
    fed = build_federated(
        "cifar10",
        num_clients=2,
        partition="dirichlet",
        seed=0,
        path=root,
        dirichlet_alpha=1.0,
    )
    assert fed.input_shape == (3, 32, 32)
    assert fed.test_x.max() <= 1.0


@pytest.mark.parametrize("protocol", [2, 5])
def test_cifar_batch_written_by_python3_loads(tmp_path: Path, protocol: int) -> None:
    data = np.arange(2 * 3072, dtype=np.int64).astype(np.uint8).reshape(2, 3072)
    path = tmp_path / "batch"
    path.write_bytes(
        pickle.dumps({b"data": data, b"labels": [3, 9]}, protocol=protocol)
    )
    x, y = load_cifar_batch(path)
    assert np.array_equal(x.reshape(2, -1), data)
    assert y.tolist() == [3, 9]


def test_cifar_unpickler_refuses_other_globals(tmp_path: Path) -> None:
    path = tmp_path / "evil"
    path.write_bytes(b"cos\nsystem\n(S'echo pwned'\ntR.")
    with pytest.raises(pickle.UnpicklingError, match=r"os\.system"):
        load_cifar_batch(path)
    with pytest.raises(FileNotFoundError, match="data_batch_1"):
        load_cifar10(tmp_path)


# --------------------------------------------------------------------------
# digits


def test_digits_are_sklearns_read_without_importing_sklearn(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The bundled file, read directly, gives exactly ``load_digits``' images and
    labels, and a run on digits no longer imports scikit-learn (1-2 s of CPU a run);
    where the file is not found, ``load_digits`` reads it."""
    import subprocess
    import sys

    from sklearn.datasets import load_digits

    from fedsim.data import _digits

    bunch = load_digits()
    x, y = load_digits_arrays()
    np.testing.assert_array_equal(x[:, 0], (bunch.images / 16.0).astype(np.float32))
    np.testing.assert_array_equal(y, bunch.target)
    assert y.dtype == np.int64
    monkeypatch.setattr(_digits, "_bundled_file", lambda: None)
    fx, fy = load_digits_arrays(flatten=True)
    np.testing.assert_array_equal(fx, x.reshape(1797, 64))
    np.testing.assert_array_equal(fy, y)
    code = ("import sys; from fedsim.data import build_federated; "
            "build_federated('digits', num_clients=3, partition='iid', seed=0); "
            "print('sklearn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"


def test_digits_shapes_and_scaling() -> None:
    x, y = load_digits_arrays()
    assert x.shape == (1797, 1, 8, 8)
    assert x.dtype == np.float32
    assert x.min() == 0.0
    assert x.max() == 1.0
    assert set(np.unique(y)) == set(range(10))
    assert load_digits_arrays(flatten=True)[0].shape == (1797, 64)
    fed = build_federated("digits", num_clients=5, partition="iid", seed=0)
    assert fed.input_shape == (1, 8, 8)
    assert fed.test_y.shape == (round(0.2 * 1797),)
    assert fed.num_train + fed.test_y.shape[0] == 1797
    flat = build_federated(
        "digits", num_clients=5, partition="iid", seed=0, flatten=True
    )
    assert flat.input_shape == (64,)


def test_stats_are_json_and_consistent() -> None:
    fed = build_federated(
        "digits", num_clients=6, partition="dirichlet", seed=3, dirichlet_alpha=0.5
    )
    s = json.loads(json.dumps(fed.stats()))
    assert s["num_clients"] == 6
    assert len(s["clients"]) == 6
    for c, shard in zip(s["clients"], fed.clients, strict=True):
        assert c["num_samples"] == shard.num_samples == sum(c["label_histogram"])
    assert sum(s["test_label_histogram"]) == s["num_test"]
    assert s["meta"]["partition_options"]["dirichlet_alpha"] == 0.5
    assert s["fingerprint"] == fed.fingerprint()
    assert pickle.loads(pickle.dumps(fed)).fingerprint() == fed.fingerprint()


# --------------------------------------------------------------------------
# partitioners


BALANCED = np.repeat(np.arange(10), 100)  # 1,000 labels, 100 per class


def _skew(labels: np.ndarray, parts: list[np.ndarray]) -> float:
    """Mean share of a client's largest class."""
    return float(np.mean([np.bincount(labels[p]).max() / p.size for p in parts]))


def test_iid_partition() -> None:
    parts = partition_iid(BALANCED, 7, make_rng(0))
    sizes = [p.size for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(1000))
    again = partition_iid(BALANCED, 7, make_rng(0))
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    fixed = partition_iid(BALANCED, 7, make_rng(0), samples_per_client=50)
    assert [p.size for p in fixed] == [50] * 7
    with pytest.raises(ValueError, match="samples_per_client: 200 x 7"):
        partition_iid(BALANCED, 7, make_rng(0), samples_per_client=200)


@pytest.mark.parametrize("recipe", ["hsu", "deltasgd_code", "feddyn_sequential"])
def test_dirichlet_skew_grows_as_alpha_shrinks(recipe: str) -> None:
    skews = [
        _skew(
            BALANCED, partition_dirichlet(BALANCED, 20, a, make_rng(1), recipe=recipe)
        )
        for a in (100.0, 1.0, 0.1, 0.01)
    ]
    assert skews == sorted(skews)
    assert skews[0] < 0.3
    assert skews[-1] > 0.8


@pytest.mark.parametrize("recipe", ["hsu", "deltasgd_code", "feddyn_sequential"])
def test_dirichlet_determinism(recipe: str) -> None:
    def run(seed: int) -> list[np.ndarray]:
        return partition_dirichlet(BALANCED, 10, 0.3, make_rng(seed), recipe=recipe)

    a, b, c = run(5), run(5), run(6)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_dirichlet_hsu_without_replacement_renormalizes() -> None:
    # Class 0 has 5 examples only: with every example dealt out, clients that
    # want class 0 must be renormalized onto the classes that remain.
    labels = np.concatenate([np.zeros(5, np.int64), np.repeat(np.arange(1, 4), 65)])
    parts = partition_dirichlet(labels, 10, 0.05, make_rng(3), recipe="hsu")
    assert [p.size for p in parts] == [20] * 10
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(200))
    empirical = partition_dirichlet(BALANCED, 8, 0.5, make_rng(4), prior="empirical")
    uniform = partition_dirichlet(BALANCED, 8, 0.5, make_rng(4), prior="uniform")
    assert all(np.array_equal(x, y) for x, y in zip(empirical, uniform, strict=True))


def test_dirichlet_deltasgd_code_rounds_and_samples_with_replacement() -> None:
    parts = partition_dirichlet(
        BALANCED, 30, 0.5, make_rng(2), recipe="deltasgd_code", samples_per_client=80
    )
    assert all(p.size >= 80 for p in parts)  # round() may add, last class fills up
    assert any(np.unique(p).size < p.size for p in parts)  # with replacement


def test_dirichlet_feddyn_sequential_sizes_and_refill() -> None:
    parts = partition_dirichlet(
        BALANCED[:997], 10, 0.01, make_rng(2), recipe="feddyn_sequential"
    )
    assert [p.size for p in parts] == [99 + 7] + [99] * 9  # remainder to client 0
    used = np.concatenate(parts)
    assert used.min() >= 0
    assert used.max() < 997
    assert np.unique(used).size < used.size  # skewed demand refilled class pools


@pytest.mark.parametrize("k", [1, 2, 3])
def test_shards_give_k_distinct_classes(k: int) -> None:
    # 600 labels cut into 20 k shards of 30 / k: every shard is class-pure
    labels = np.repeat(np.arange(10), 60)
    parts = partition_shards(labels, 20, make_rng(k), shards_per_client=k)
    assert [p.size for p in parts] == [600 // (20 * k) * k] * 20
    assert np.unique(np.concatenate(parts)).size == sum(p.size for p in parts)
    assert all(np.unique(labels[p]).size == k for p in parts)
    again = partition_shards(labels, 20, make_rng(k), shards_per_client=k)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))


def test_shards_errors() -> None:
    fed = build_federated(
        "digits",
        num_clients=10,
        partition="shards",
        seed=0,
        classes_per_client=3,
        flatten=True,
    )
    assert all(c.num_samples == 1437 // 30 * 3 for c in fed.clients)
    with pytest.raises(ValueError, match="3 distinct classes"):
        partition_shards(np.repeat([0, 1], 50), 5, make_rng(0), shards_per_client=3)
    with pytest.raises(ValueError, match="num_clients: 20 clients need"):
        partition_iid(np.arange(10) % 2, 20, make_rng(0))


# --------------------------------------------------------------------------
# argument validation


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dataset": "femnist"}, "Invalid dataset: 'femnist'.*synthetic, digits"),
        ({"partition": "pathological"}, "Invalid partition: 'pathological'"),
        ({"partition": "natural"}, "'natural' for dataset 'digits'.*iid, dirichlet"),
        ({"dataset": "synthetic", "partition": "iid"}, "allowed: natural"),
        ({"partition": "dirichlet"}, r"Missing option\(s\) \['dirichlet_alpha'\]"),
        ({"dirichlet_alpha": -1.0, "partition": "dirichlet"}, "dirichlet_alpha: -1.0"),
        (
            {"recipe": "lda", "partition": "dirichlet", "dirichlet_alpha": 1.0},
            "Invalid recipe: 'lda'.*hsu, deltasgd_code, feddyn_sequential",
        ),
        ({"alpah": 1.0}, r"Unknown option\(s\) \['alpah'\].*allowed"),
        ({"seed": -1}, "Invalid seed: -1"),
        ({"seed": 1.5}, "Invalid seed: 1.5"),
        ({"seed": True}, "Invalid seed: True"),
        ({"num_clients": 0}, "Invalid num_clients: 0"),
        ({"test_fraction": 1.5}, "Invalid test_fraction: 1.5"),
        (
            {"dataset": "synthetic", "partition": "natural", "alpha": -2},
            "Invalid alpha: -2",
        ),
        ({"dataset": "synthetic", "partition": "natural", "n_cap": 3}, "n_cap: 3"),
        (
            {"dataset": "synthetic", "partition": "natural", "holdout": "x"},
            "Invalid holdout: 'x'.*per_user, global",
        ),
        ({"dataset": "mnist"}, r"Missing option\(s\) \['path'\]"),
    ],
)
def test_build_federated_errors_name_the_value(kwargs: dict, match: str) -> None:
    args = {
        "dataset": "digits",
        "num_clients": 4,
        "partition": "iid",
        "seed": 0,
        **kwargs,
    }
    with pytest.raises(ValueError, match=match):
        build_federated(args.pop("dataset"), **args)
