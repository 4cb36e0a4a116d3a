"""Naive, paper-shaped reference implementations for parity tests.

Each ``*_reference.py`` writes an update rule the way its paper does: loops
over elements and clients on plain Python floats, no vectorisation and no
sharing with ``fedsim``. Tests compare the production code against these
after every step.
"""
