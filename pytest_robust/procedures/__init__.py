"""Procedures: the statistical loops that metrics plug into.

- ``bernoulli``: i.i.d. draws (input, perturbation) -> an anytime-valid gate (TSRM, corruption
  accuracy, NPPR's gate, any "perturbation + a declaration" check);
- ``per_input``: one statistic per input, over input blocks -> a bound over inputs (adversarial
  accuracy, the q check's context, any per-input check);
- ``rounds``: per-input sequential tests scheduled in rounds (certified accuracy);
- ``columns``: the host arrays a loop appends to step by step, in one buffer grown by doubling.
"""
