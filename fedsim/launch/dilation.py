"""How slowly a run goes: choosing ``--dilation auto`` for this machine.

Dilation is real seconds per emulated second. :func:`calibrate_dilation`
picks the smallest power of two at which this host's real work (local
steps, the longest task, a round's message turnaround, the burst of work a
loop does at one emulated instant) fits inside what the scenario emulates;
:func:`measure_step_time` times a few real local steps of the scenario's
model. ``fedsim run`` calls them from
:func:`fedsim.launch.prep.prepare`.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Sequence
from typing import Any

from fedsim.actors.setup import build_data, build_model, local_config, model_shapes
from fedsim.algorithms import flatten, local_train
from fedsim.launch._turnaround import measure_turnaround
from fedsim.scenario import Scenario
from fedsim.scenario.network import NetPlan
from fedsim.wire.tensors import TensorSpec

__all__ = ["at_once", "calibrate_dilation", "measure_step_time", "task_spec"]

log = logging.getLogger(__name__)


def measure_step_time(sc: Scenario, data: Any = None) -> float:
    """Real seconds one local step of this scenario's model takes on this host.

    ``data`` is the scenario's federated dataset when the caller built it already.
    """
    import torch  # lazy: torch stays out of client hosts

    torch.set_num_threads(1)
    data = build_data(sc) if data is None else data
    model = build_model(sc, tuple(data.input_shape), int(data.num_classes))
    shard = data.clients[0]
    x, y = torch.as_tensor(shard.x), torch.as_tensor(shard.y)
    cfg = local_config(sc)
    x0 = flatten(list(model.parameters()))
    gen = torch.Generator().manual_seed(0)
    local_train(model, x0, x, y, cfg, gen)
    t0 = time.perf_counter()
    _, stats = local_train(model, x0, x, y, cfg, gen)
    steps: int = stats["steps"]
    return (time.perf_counter() - t0) / max(1, steps)


def calibrate_dilation(sc: Scenario, hosts: int, real_step: float | None = None,
                       turnaround: float | None = None, cores: int | None = None,
                       steps: Sequence[int] | None = None) -> float:
    """Pick a dilation so the host's real work fits the scenario's emulated time.

    The smallest power of two that satisfies the bounds below. ``a = max(1
    ms, 5 % x d)`` is the lateness the verdict allows, ``d`` the smallest
    configured one-way link delay (:mod:`netem.fidelity`); ``real_step`` is
    the real seconds of one local step on this host (timed at start-up),
    ``steps`` the local steps of each client's task (from its shard), and
    a client host's torch worker runs ``w`` = the algorithm's tasks at once
    divided by the ``hosts`` client hosts, one at a time, earliest due
    first.

    * **compute, typical**: the worker's ``w`` tasks of the mean size fit,
      with fourfold headroom (the verdict judges a p99; this is a typical
      time), in the emulated time they have: for devices that take time,
      ``4 w real_step <= dilation x`` the fastest client's step time; a
      device that computes instantly (``devices.step_time = 0``) has its
      result due the moment its task began, and the real compute is
      lateness (:mod:`fedsim.actors.client`), so ``4 w mean(steps)
      real_step <= dilation x a``.
    * **compute, the longest task**: a task that arrives while the
      longest one (``max(steps)``) runs waits for it, so with twofold
      headroom the quickest budget (the fewest steps times its client's
      step time) fits the longest task and its own, and an instant device's
      result waits at most for the longest task and ``w - 1`` mean ones
      within ``a``. With equal local work (``client.local_steps``) this
      never binds; with a long-tailed shard size it does.
    * **turnaround**: a message is stamped with the emulated instant its
      sender decided to send it, and the link delivers it that link delay
      later; every real second its sender, the transport and its receiver
      spend beyond that is lateness. A synchronous round's tasks all leave
      at one instant, so the last one's lateness is the real time the
      round's messages take through the server's loop and a host's.
      ``turnaround`` is that time measured on this host at start-up
      (:func:`fedsim.launch._turnaround.measure_turnaround`: the algorithm's tasks
      at once, as model-sized task messages, out to a second process and
      back as updates; median of 15 bursts). When there are more event
      loops (the server and the client hosts; torch workers run under
      ``SCHED_IDLE`` and yield) than ``cores``, the loops take turns on a
      core: ``q = (hosts + 1) / cores``. With fourfold headroom, ``4 q
      turnaround <= dilation x (d + a)``. Links with tens of milliseconds
      of delay hide the turnaround (the bound asks for less than 1).
    * **round burst**: a link's delay hides a message's way, not the work
      its loop does at one emulated instant. When a synchronous round
      closes, the server aggregates and encodes and sends the next round's
      ``m`` = ``n`` tasks (:func:`at_once`) at that instant, and the round's
      other updates, due at the same instant, wait for it; the hosts then
      take the tasks, all due at one instant, in turn. So, with fourfold
      headroom, ``4 q turnaround x m / n <= dilation x a``, whatever the
      delay; DGA sends a closed round's average to every client at once
      (``m`` = the clients); an asynchronous server answers an update with
      one task (``m = 1``). Measured on this 2-core machine (fedprox-digits, 50 ms links,
      8 tasks a round, a turnaround of 1.6 ms): the late timers were
      updates due at the instant the server aggregated and sent the next
      round (and tasks due at a host while the other took its own), 2.7-5
      ms late at dilation 1 (34 of 449 over 2.5 ms) and 4-6 real ms at 2
      (13 of 457 over 2.5 ms; it passes at 2 only on some runs): up to 2.4 q
      turnaround; the bound asks for 4.

    With no delay and instant devices the dilation costs nothing in real
    time: such a run takes as long at any dilation (nothing waits for
    emulated time to pass), and only its lateness, in emulated seconds,
    shrinks. On this 2-core machine ``tools/bench_overhead.py``'s scenario
    (FedAvg, 10 of 100 clients per round, a 57 KB MLP, one epoch of batches
    of 32 on Synthetic(1,1) shards: 2 to 108 local steps, 6.8 on average,
    for seed 1; no delay, instant devices) measured 0.2 ms per step and a
    turnaround of 1.6-2.0 ms for its 10 tasks: typical compute asks for 4
    x 5 x 6.8 x 0.2 ms / 1 ms = 27, the longest task for 2 x (108 + 4 x
    6.8) x 0.2 ms / 1 ms = 54, the turnaround for 4 x 1.5 x 1.8 ms / 1 ms
    = 11: 64, or 128 at the 0.25 ms per step a fresh process often
    measures. Seed 3 has a shard of 37,900 examples (1184 steps): 512.
    Every such run passed its verdict on the idle machine
    (docs/measurements.md#fidelity-under-load).

    The choice is logged at INFO in one line (``fedsim run`` shows it without
    ``-v``) with the measurements and what each bound asks for.
    """
    plan = NetPlan(sc, host_step_time=sc.devices.host_step_time)
    step_times = [plan.device(c).mean_step() for c in range(sc.data.num_clients)]
    n = sc.algorithm.tasks_at_once(sc.data.num_clients)
    w = max(1.0, n / hosts)
    delay = plan.min_delay
    allowed = max(1e-3, 0.05 * delay)
    data: Any = None
    if real_step is None or turnaround is None or steps is None:
        data = build_data(sc)
    if real_step is None:
        real_step = measure_step_time(sc, data)
    if steps is None:
        cfg = local_config(sc)
        steps = [cfg.num_steps(len(c.y)) for c in data.clients]
    if turnaround is None:
        try:
            turnaround = measure_turnaround(sc, task_spec(sc, data), n)
        except (OSError, RuntimeError) as exc:  # the run goes on; its verdict judges it
            log.warning("dilation auto: no turnaround measured (%s); links are assumed "
                        "to hide it", exc)
            turnaround = 0.0
    for name, value in (("real_step", real_step), ("turnaround", turnaround)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"Invalid {name} {value!r}: a time in seconds")
    mean_steps, longest = sum(steps) / max(1, len(steps)), max(steps, default=1)
    if min(step_times, default=0.0) > 0:
        typical = 4.0 * w * real_step / min(step_times)
        k, s = min(zip(steps, step_times, strict=True), key=lambda ks: ks[0] * ks[1])
        tail = 2.0 * (longest + k) * real_step / (k * s)
    else:
        typical = 4.0 * w * mean_steps * real_step / allowed
        tail = 2.0 * (longest + (w - 1) * mean_steps) * real_step / allowed
    cores = cores or len(os.sched_getaffinity(0))
    q = max(1.0, (hosts + 1) / cores)
    network = 4.0 * q * turnaround / (delay + allowed)
    # the messages one loop handles at one emulated instant: a round's tasks, or one
    burst = 4.0 * q * turnaround * (at_once(sc) / n) / allowed
    need = max(typical, tail, network, burst)
    choice = float(2 ** max(0, math.ceil(math.log2(need)))) if need > 1 else 1.0
    bounds = {"compute": typical, "longest task": tail, "turnaround": network,
              "round burst": burst}
    log.info("dilation auto: %g (measured %.3g ms per local step, a turnaround of %.3g ms "
             "for %d tasks; needs: %s)", choice, real_step * 1e3, turnaround * 1e3, n,
             ", ".join(f"{k} {v:.3g}" for k, v in bounds.items()))
    return choice


def at_once(sc: Scenario) -> int:
    """How many model messages the server sends at one emulated instant: a synchronous
    round's tasks when it opens, DGA's average to every client when a round closes,
    one task per update for an asynchronous server
    (:meth:`~fedsim.algorithms.AlgorithmConfig.sent_at_once`)."""
    return sc.algorithm.sent_at_once(sc.data.num_clients)


def task_spec(sc: Scenario, data: Any) -> Any:
    """The :class:`~fedsim.wire.tensors.TensorSpec` of this scenario's task messages."""
    model = build_model(sc, tuple(data.input_shape), int(data.num_classes))
    return TensorSpec([("float32", s) for s in model_shapes(model)]).repeated(
        sc.algorithm.spec.task_copies)
