"""Analyses: estimates and reports that are not gates, and the sampling machinery the metrics share.

- ``cohen``: Cohen's CERTIFY and PREDICT; ``pa_report``: the empirical distribution of p_A;
  ``smoothing_draws``: the noise streams and class counts of randomized smoothing;
- ``q_plan``, ``q_draws``, ``q_estimate``: the inputs, samples, per-input estimates, MCMC
  diagnostics and look-by-look gate of intermediate-q; ``q_curve``: Z_q against q;
- ``nppr_context``: NPPR's per-input PR, context noises and PGD floor.
"""
