"""Results: the run directory written and read back, a run's values, timeline, plots, comparisons.

:mod:`~fedsim.results.writer` writes a run directory so that a run killed at
any moment leaves it readable; :mod:`~fedsim.results.reader` reads any run
directory back (:func:`~fedsim.results.reader.load_run`);
:mod:`~fedsim.results.values` gives a run's results as Python values
(:class:`~fedsim.results.values.RunResult`, what :func:`fedsim.run` returns);
:mod:`~fedsim.results.phases` estimates where a run's time goes;
:mod:`~fedsim.results.timeline` extracts what every client did, when;
:mod:`~fedsim.results.report` formats a run's summary for the terminal;
:mod:`~fedsim.results.plots` draws one run and :mod:`~fedsim.results.compare`
several. Nothing here imports the actors: a run directory is readable without them.
"""
