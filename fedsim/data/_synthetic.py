r"""The FedProx Synthetic(alpha, beta) generator.

Implementation of the FedProx authors' generator
(``litian96/FedProx``, ``data/synthetic_1_1/generate_synthetic.py`` and
``data/synthetic_iid/generate_iid.py``; Li et al., "Federated Optimization in
Heterogeneous Networks", https://arxiv.org/abs/1812.06127);
docs/algorithms.md#synthetic-the-fedprox-generator-uncapped. It is *not*
LEAF's own ``data/synthetic`` generator, which is a different model.

For each user :math:`k` (d = 60 features, C = 10 classes):

.. math::

    n_k &= \lfloor \mathrm{LogNormal}(4, 2) \rfloor + 50 \\
    u_k &\sim N(0, \alpha^2),\quad B_k \sim N(0, \beta^2) \\
    v_k &\sim N(B_k, 1)^{60},\quad W_k \sim N(u_k, 1)^{60 \times 10},\quad
    b_k \sim N(u_k, 1)^{10} \\
    x &\sim N(v_k, \Sigma),\ \Sigma = \mathrm{diag}(j^{-1.2}) \\
    y &= \arg\max_c (x^\top W_k + b_k)_c

(``numpy.random.normal(0, alpha)`` takes a standard deviation, so
:math:`u_k` has std ``alpha``, as in the authors' code.) The iid variant
shares one :math:`W, b \sim N(0, 1)` and sets :math:`v_k = 0`.

The draws follow the authors' order (sizes, ``u``, ``B``, every ``v_k``, then
per user ``W_k``, ``b_k`` and ``x``) from one ``numpy.random.Generator``.
Two deliberate differences, neither of which changes the distribution:

- :math:`x` is drawn as :math:`v_k + \sqrt{\Sigma}\, z` with
  :math:`z \sim N(0, I)` rather than through ``multivariate_normal``
  (whose SVD could differ in the last bit between BLAS builds);
- the logits are summed feature by feature with elementwise operations (no
  BLAS), so a thread-count or CPU difference between processes cannot flip
  an argmax.

Hence the same seed gives identical arrays, bit for bit, in every process.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from fedsim.data._common import check_int, check_nonneg_float, make_rng

__all__ = [
    "SYNTHETIC_CLASSES",
    "SYNTHETIC_DIM",
    "SyntheticUsers",
    "generate_synthetic",
]

logger = logging.getLogger(__name__)

SYNTHETIC_DIM = 60
SYNTHETIC_CLASSES = 10
_LOG_MEAN, _LOG_SIGMA, _MIN_SAMPLES = 4.0, 2.0, 50
_BIG_DATASET = 2_000_000  # examples; above this, log a hint about n_cap


@dataclass(frozen=True, slots=True, eq=False)
class SyntheticUsers:
    """Per-user Synthetic data before any train/test split.

    Attributes
    ----------
    x : tuple of numpy.ndarray
        float32 features, one ``(n_k, 60)`` array per user.
    y : tuple of numpy.ndarray
        int64 labels in ``0..9``, one ``(n_k,)`` array per user.
    num_samples : tuple of int
        Realized :math:`n_k` (after the cap, if any).
    num_samples_uncapped : tuple of int
        :math:`n_k` as drawn, before the cap.
    """

    x: tuple[np.ndarray, ...]
    y: tuple[np.ndarray, ...]
    num_samples: tuple[int, ...]
    num_samples_uncapped: tuple[int, ...]

    @property
    def users(self) -> tuple[str, ...]:
        """The authors' user names, ``f_00000``, ``f_00001``, ..."""
        return tuple(f"f_{i:05d}" for i in range(len(self.y)))


#: rows labelled at once by :func:`_labels` (a batch's arrays: about 5 MB)
_LABEL_BATCH_ROWS = 1 << 16


def _labels(batch: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> list[np.ndarray]:
    """``argmax(_logits(x, w, b))`` of every ``(x, w, b)`` in ``batch``, computed at once.

    The same elementwise operations in the same order as :func:`_logits` per
    user (so the labels are bit for bit the same), on many users at a time:
    users of one size as one 3-d array, the others' rows stacked. A loop over
    60 features per user cost 1 s of start-up at 10,000 users.
    """
    labels: list[np.ndarray] = [np.empty(0, np.int64)] * len(batch)
    by_size: dict[int, list[int]] = {}
    for i, (x, _, _) in enumerate(batch):
        by_size.setdefault(len(x), []).append(i)
    rest: list[int] = []
    for n, group in by_size.items():
        if len(group) < 8:
            rest.extend(group)
            continue
        x = np.stack([batch[i][0] for i in group])           # (users, n, d)
        w = np.stack([batch[i][1] for i in group])           # (users, d, c)
        out = np.repeat(np.stack([batch[i][2] for i in group])[:, None, :], n, axis=1)
        for j in range(x.shape[2]):
            out += x[:, :, j : j + 1] * w[:, None, j]
        for i, lab in zip(group, np.argmax(out, axis=2).astype(np.int64), strict=True):
            labels[i] = lab
    if rest:
        rest.sort()
        sizes = [len(batch[i][0]) for i in rest]
        user = np.repeat(np.arange(len(rest)), sizes)
        x = np.concatenate([batch[i][0] for i in rest])
        w = np.stack([batch[i][1] for i in rest])
        out = np.stack([batch[i][2] for i in rest])[user]
        for j in range(x.shape[1]):
            out += x[:, j : j + 1] * w[user, j]
        parts = np.split(np.argmax(out, axis=1).astype(np.int64), np.cumsum(sizes)[:-1])
        for i, lab in zip(rest, parts, strict=True):
            labels[i] = lab
    return labels


def _logits(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``x @ w + b`` summed in a fixed order with elementwise IEEE operations.

    A BLAS product may sum in an order that depends on the thread count or
    the CPU's vector width; this loop cannot, so an argmax computed by the
    server and by a client host on another machine agrees bit for bit.
    """
    out = np.broadcast_to(b, (x.shape[0], b.shape[0])).copy()
    for j in range(x.shape[1]):
        out += x[:, j : j + 1] * w[j]
    return out


def generate_synthetic(
    num_users: int,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    iid: bool = False,
    n_cap: int | None = None,
    n_equal: int | None = None,
    seed: int | np.random.Generator,
) -> SyntheticUsers:
    """Generate FedProx Synthetic(alpha, beta) for ``num_users`` users.

    Parameters
    ----------
    num_users : int
        Number of users (the FedProx paper uses 30, AsyncFedED 10).
    alpha, beta : float
        Standard deviations of the per-user model mean :math:`u_k` and
        feature-mean offset :math:`B_k`; ignored when ``iid``.
    iid : bool
        The authors' ``synthetic_iid`` variant: shared ``W, b``, ``v_k = 0``.
    n_cap : int, optional
        Upper bound on :math:`n_k` (none by default, as in the authors'
        generator). Uncapped, a user can hold tens of thousands
        of examples (lognormal tail).
    n_equal : int, optional
        Give every user exactly this many examples instead of the generator's
        lognormal sizes (EXT: a paper that gives each client the same number
        of examples, as Delta-SGD's 500). The sizes are still drawn first, so
        the rest of the random stream is consumed in the same order.
    seed : int or numpy.random.Generator
        An ``int`` seeds ``np.random.default_rng(seed)``; a generator is used
        as is (and advanced).

    Returns
    -------
    SyntheticUsers
        Features, labels and realized sizes per user.
    """
    num_users = check_int("num_users", num_users, 1)
    alpha = check_nonneg_float("alpha", alpha)
    beta = check_nonneg_float("beta", beta)
    if not isinstance(iid, bool | np.bool_):
        raise ValueError(f"Invalid iid: {iid!r} (must be True or False)")
    if n_cap is not None:
        n_cap = check_int("n_cap", n_cap, 10)
    if n_equal is not None:
        n_equal = check_int("n_equal", n_equal, 10)
    rng = seed if isinstance(seed, np.random.Generator) else make_rng(seed)
    d, c = SYNTHETIC_DIM, SYNTHETIC_CLASSES

    drawn = (
        rng.lognormal(_LOG_MEAN, _LOG_SIGMA, num_users).astype(np.int64) + _MIN_SAMPLES
    )
    sizes = drawn if n_cap is None else np.minimum(drawn, n_cap)
    if n_equal is not None:
        sizes = np.full(num_users, n_equal, dtype=np.int64)
    total = int(sizes.sum())
    if total > _BIG_DATASET:
        logger.info(
            "Synthetic: %d examples in %d users; n_cap bounds this", total, num_users
        )
    std_x = np.sqrt(np.arange(1, d + 1, dtype=np.float64) ** -1.2)

    # Every draw below is a standard normal z shifted (``rng.normal(m, 1.0)`` is
    # m + 1.0 * z, and 1.0 * z is z): the stream is drawn a block at a time and
    # cut up in the authors' order (per user: w, b, then x), which gives the
    # same numbers bit for bit as one call per array (no call carries state but
    # the bit generator), without 30,000 calls at 10,000 users.
    if iid:
        mean_x = np.zeros((num_users, d))
        shared_w = rng.normal(0.0, 1.0, (d, c))
        shared_b = rng.normal(0.0, 1.0, c)
    else:
        mean_w = rng.normal(0.0, alpha, num_users)
        offset = rng.normal(0.0, beta, num_users)
        mean_x = offset[:, None] + rng.standard_normal((num_users, d))

    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    per_user = 0 if iid else d * c + c  # draws for w and b
    k0 = 0
    while k0 < num_users:  # a batch of users: about _LABEL_BATCH_ROWS rows
        k1, rows = k0, 0
        while k1 < num_users and (k1 == k0 or rows < _LABEL_BATCH_ROWS):
            rows += int(sizes[k1])
            k1 += 1
        z = rng.standard_normal(per_user * (k1 - k0) + rows * d)
        batch: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        at = 0
        for k in range(k0, k1):
            if iid:
                w, b = shared_w, shared_b
            else:
                w = mean_w[k] + z[at:at + d * c].reshape(d, c)
                b = mean_w[k] + z[at + d * c:at + per_user]
                at += per_user
            n = int(sizes[k])
            x = mean_x[k] + z[at:at + n * d].reshape(n, d) * std_x
            at += n * d
            batch.append((x, w, b))
        ys.extend(_labels(batch))
        xs.extend(x.astype(np.float32) for x, _, _ in batch)
        k0 = k1
    return SyntheticUsers(
        x=tuple(xs),
        y=tuple(ys),
        num_samples=tuple(int(n) for n in sizes),
        num_samples_uncapped=tuple(int(n) for n in drawn),
    )
