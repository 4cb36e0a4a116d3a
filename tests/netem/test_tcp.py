"""TCP loss-to-delay (docs/netem.md#loss-on-tcp-is-delay): Linux's constants, formulas, numbers."""

import pytest

from netem.loss import Bernoulli
from netem.lossprocess import ScriptedLoss
from netem.rng import stream
from netem.tcp import (
    TcpConnection,
    TcpParams,
    mathis_throughput,
    pftk_throughput,
    rto_value,
    segments,
    slow_start_rounds,
)


@pytest.mark.parametrize(
    ("nbytes", "nseg", "rounds2", "rounds15"),
    [
        (100_000, 70, 3, 4),
        (1_000_000, 691, 7, 9),
        (10_000_000, 6907, 10, 15),
        (45_000_000, 31_078, 12, 19),
    ],
)
def test_slow_start_rounds_match_reference_table(nbytes, nseg, rounds2, rounds15):
    assert segments(nbytes) == nseg
    assert slow_start_rounds(nseg, 10, 2.0) == rounds2
    assert slow_start_rounds(nseg, 10, 1.5) == rounds15


@pytest.mark.parametrize(("nseg", "rounds"), [(70, 3), (691, 7), (6907, 10)])
def test_unlimited_rate_slow_start_costs_one_rtt_per_extra_round(nseg, rounds):
    r = TcpConnection().transfer(0.0, nseg, 0.0, 0.1)
    assert r.slow_start == pytest.approx((rounds - 1) * 0.1)
    assert r.recovery == 0.0


def test_slow_start_gaps_until_window_covers_bdp():
    # RTT 100 ms, 1 ms per segment: BDP 100 segments. Rounds of 10, 20, 40, 80
    # leave the bottleneck idle for RTT + tau - w tau each; 160 fills the pipe.
    r = TcpConnection().transfer(0.0, 1000, 0.001, 0.1)
    gaps = sum(0.101 - w * 0.001 for w in (10, 20, 40, 80))
    assert r.slow_start == pytest.approx(gaps)
    # window already covers the BDP: no slow-start cost
    assert TcpConnection().transfer(0.0, 1000, 0.02, 0.1).slow_start == 0.0


def test_zero_loss_gives_zero_recovery():
    lp = Bernoulli(0.0).process(stream(0, "s"), stream(0, "l"))
    r = TcpConnection().transfer(0.0, 5000, 1e-4, 0.05, lp)
    assert r.recovery == 0.0
    assert r.n_lost == 0
    assert lp.stats.packets == 5000


def test_rto_formula_floor_and_cap():
    p = TcpParams()
    assert rto_value(None, 0.0, p) == 1.0  # RFC 6298 initial RTO
    assert rto_value(0.1, 0.05, p) == pytest.approx(0.3)  # m + max(2m, 200 ms)
    assert rto_value(0.01, 0.001, p) == pytest.approx(0.21)  # >= 200 ms floor
    assert rto_value(100.0, 50.0, p) == 120.0  # TCP_RTO_MAX
    c = TcpConnection()
    c.rtt_sample(0.1)
    assert (c.srtt, c.rttvar) == (0.1, 0.05)
    c.rtt_sample(0.2)
    assert c.rttvar == pytest.approx(0.75 * 0.05 + 0.25 * 0.1)
    assert c.srtt == pytest.approx(0.875 * 0.1 + 0.125 * 0.2)


def test_fast_retransmit_costs_about_one_rtt():
    r = TcpConnection().transfer(0.0, 20, 0.0, 0.1, ScriptedLoss([5]))
    assert r.recovery == pytest.approx(0.1)
    assert (r.n_lost, r.n_retransmits, r.n_tlp, r.n_rto) == (1, 1, 0, 0)


def test_tail_loss_probe_is_two_srtt():
    r = TcpConnection().transfer(0.0, 5, 0.0, 0.1, ScriptedLoss([4]))
    assert r.recovery == pytest.approx(0.2)
    assert r.n_tlp == 1


def test_single_segment_tlp_adds_delayed_ack_allowance():
    # one segment in flight: PTO = 2 SRTT + 200 ms (< RTO = 0.3 + 0.6)
    r = TcpConnection().transfer(0.0, 1, 0.0, 0.3, ScriptedLoss([0]))
    assert r.recovery == pytest.approx(0.8)
    # at a short RTT the PTO is capped by the RTO: 2*0.1 + 0.2 > 0.1 + 0.2
    r = TcpConnection().transfer(0.0, 1, 0.0, 0.1, ScriptedLoss([0]))
    assert r.recovery == pytest.approx(0.3)


def test_lost_retransmission_costs_rto_with_doubling():
    # TLP at 0.8 s, its retransmission lost -> RTO 0.9 s, lost again -> 1.8 s
    r = TcpConnection().transfer(0.0, 1, 0.0, 0.3, ScriptedLoss([0, 1, 2]))
    assert r.recovery == pytest.approx(0.8 + 0.9 + 1.8)
    assert r.n_rto == 2
    assert not r.failed


def test_connection_fails_after_max_retries():
    r = TcpConnection(TcpParams(max_retries=3)).transfer(
        0.0, 1, 0.0, 0.1, ScriptedLoss(range(50))
    )
    assert r.failed


def test_slow_start_after_idle_resets_cwnd_else_carries_it():
    c = TcpConnection()
    first = c.transfer(0.0, 691, 0.0, 0.1)
    assert c.cwnd > 10
    busy = c.transfer(c.last_activity + 0.01, 691, 0.0, 0.1)  # not idle
    assert busy.slow_start < first.slow_start
    idle = c.transfer(c.last_activity + 5.0, 691, 0.0, 0.1)  # idle >> RTO
    assert idle.slow_start == pytest.approx(first.slow_start)
    c2 = TcpConnection(TcpParams(slow_start_after_idle=False))
    c2.transfer(0.0, 691, 0.0, 0.1)
    assert c2.transfer(100.0, 691, 0.0, 0.1).slow_start < first.slow_start


@pytest.mark.parametrize(("p", "rtt"), [(0.01, 0.05), (0.001, 0.02), (0.01, 0.1)])
def test_long_reno_transfer_matches_mathis(p, rtt):
    n, tau = 100_000, 1448 * 8 / 1e9  # 1 Gbit/s: window-limited, not rate-limited
    lp = Bernoulli(p).process(stream(1, "m"), stream(1, "l"))
    r = TcpConnection(TcpParams(cc="reno", max_cwnd=100_000)).transfer(
        0.0, n, tau, rtt, lp
    )
    rate = n * 1448 / (r.slow_start + r.recovery + n * tau)
    assert rate == pytest.approx(mathis_throughput(1448, rtt, p), rel=0.2)


def test_bbr_ignores_random_loss_for_the_window():
    def rate(cc):
        lp = Bernoulli(0.01).process(stream(2, "m"), stream(2, "l"))
        c = TcpConnection(TcpParams(cc=cc, max_cwnd=100_000))
        r = c.transfer(0.0, 50_000, 1448 * 8 / 1e8, 0.05, lp)
        return 50_000 * 1448 * 8 / (r.slow_start + r.recovery + 50_000 * 1448 * 8 / 1e8)

    assert rate("bbr") > 5 * rate("reno")


def test_reference_throughput_numbers():
    # the formulas worked out by hand (Mbit/s): Mathis C=1.22, PFTK b=1 T0 = RTT + 200 ms
    assert mathis_throughput(1448, 0.02, 0.001) * 8e-6 == pytest.approx(22.43, abs=0.01)
    assert mathis_throughput(1448, 0.05, 0.01) * 8e-6 == pytest.approx(2.84, abs=0.01)
    assert pftk_throughput(1448, 0.02, 0.01, 0.22) * 8e-6 == pytest.approx(
        5.68, abs=0.01
    )
    assert pftk_throughput(1448, 0.05, 0.05, 0.25) * 8e-6 == pytest.approx(
        0.79, abs=0.01
    )


def test_params_validation():
    with pytest.raises(ValueError, match=r"TcpParams.cc = 'vegas': must be one of"):
        TcpParams(cc="vegas")
    with pytest.raises(
        ValueError, match=r"TcpParams.rto_max = 0.1: must be >= rto_min"
    ):
        TcpParams(rto_max=0.1)


def test_a_burst_does_not_outlive_the_rto_backoff():
    """Bursts last packet slots, not silences: after a 200+ ms RTO on a 20 Mbit/s
    link (some 300 slots) a 2-packet-burst channel has forgotten its state, so a
    retransmission is lost at the mean rate, not at the bad state's 50 %."""
    from netem.loss import GilbertElliott

    g = GilbertElliott.from_durations(good=100, bad=2)
    loss = g.process(stream(1, "l", "loss-state"), stream(1, "l", "loss-draw"))
    conn = TcpConnection()
    tau = 1500 * 8 / 20e6
    rtos = retx = 0
    for i in range(4000):
        r = conn.transfer(i * 5.0, 14, tau, 0.132, loss)
        rtos += r.n_rto
        retx += r.n_retransmits
    assert retx > 300
    # a retransmission is lost again at about the mean loss rate, not the bad state's 50 %
    assert rtos / retx < 2 * g.mean_loss_rate() + 0.01
