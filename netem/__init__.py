"""netem: user-space network and device emulation, usable without fedsim.

Links with delay, jitter, correlation, rate, loss (and loss turned into TCP
recovery delay), availability and suspension processes, device compute
times, an emulated clock with time dilation, one timer heap per event loop,
and a fidelity monitor that judges how faithfully it all ran. Import the
modules you need (``netem.link``, ``netem.clock``, ...); this package
re-exports nothing.
"""
