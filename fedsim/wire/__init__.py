"""The wire: the message schema, the model's tensors, the codec and the ZeroMQ transport.

:mod:`~fedsim.wire.messages` says *what* travels (records checked when built:
:mod:`~fedsim.wire.records`; their errors: :mod:`~fedsim.wire.errors`; the
model: :mod:`~fedsim.wire.tensors`), :mod:`~fedsim.wire.codec` *how* (frames,
envelope, size caps, no copies), :mod:`~fedsim.wire.transport` over which
sockets. :mod:`~fedsim.wire.statefile` writes the same values to disk
(checkpoints, client state) without pickle. Nothing here imports torch at
import time: client hosts use all of it.
"""
