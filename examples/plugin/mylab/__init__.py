"""mylab: an algorithm, a model and a dataset for fedsim, outside fedsim.

Name them in a scenario as ``module:attribute`` references (see
``normtrim.toml``), or install this directory (``pip install -e
examples/plugin``) and use the entry-point names its ``pyproject.toml``
declares (``normtrim``, ``tinymlp``, ``blobs``).
"""
