"""Actors: the server, the client actors and the processes that host them.

The actors wire the pure algorithms (:mod:`fedsim.algorithms`) to the
network emulator (:mod:`netem`) and ZeroMQ (:mod:`fedsim.wire.transport`).
"""
