"""Launching a federation (``fedsim run``, ``fedsim server``): processes, run directory, dilation.

:mod:`~fedsim.launch.runner` runs one federation: it prepares the run
directory (:mod:`~fedsim.launch.prep`), starts the client-host processes on
this machine (:mod:`~fedsim.launch.local_hosts`) and the server actor, and
leaves the results behind; :mod:`~fedsim.launch.dilation` chooses
``--dilation auto`` for this machine. The package is ``launch``, not ``run``:
``fedsim.run`` is the Python API's function (:func:`fedsim.api.run`), and a
subpackage of that name would replace it as an attribute of :mod:`fedsim`
once imported.
"""
