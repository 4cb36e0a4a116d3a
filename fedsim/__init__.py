"""fedsim: a federated-learning simulator in which time is real.

The server and every client are asyncio actors that exchange msgpack-encoded
tensors over ZeroMQ, through the user-space network emulator :mod:`netem`.
"""

import logging

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())
