"""The machinery of tools/claims.py, which keeps the claims themselves and the command line.

- :mod:`claimslib.verdict`: a claim's checks, paired confidence intervals,
  the verdict rule and the :class:`~claimslib.verdict.Finding` an evaluator returns;
- :mod:`claimslib.runs`: selecting a sweep's runs and reading what their files say;
- :mod:`claimslib.charts`: the figure an evaluator asks for, drawn;
- one module of evaluators per paper: :mod:`claimslib.fedasync`,
  :mod:`claimslib.deltasgd`, :mod:`claimslib.dga`, :mod:`claimslib.asyncfeded`,
  :mod:`claimslib.fedspeed`;
- :mod:`claimslib.writer`: a claim's record, docs/claims.md and README.md's table.

It is imported with tools/ on ``sys.path`` (as ``python tools/claims.py`` has it).
"""
