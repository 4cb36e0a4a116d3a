"""A test kit: a virtual-time loop, an in-memory network and federation, and a fuzzer.

:mod:`~fedsim.testing.virtual_time` is an event loop whose clock jumps to the
next timer; :mod:`~fedsim.testing.memory_network` implements the transport's
interfaces without sockets; on the two, :mod:`~fedsim.testing.federation`
runs a whole federation (the real server, client hosts and client actors, in
one process, on virtual time). :mod:`~fedsim.testing.fuzz` makes the hostile
frames that no message may crash a federation with, in memory or through a
real ``fedsim clients`` host (``python -m fedsim.testing.fuzz``).
"""
