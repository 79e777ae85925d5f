"""Declarative suites: ``robust_*.yaml`` files collected as pytest tests, one test per check.

A suite names its model and data by import path, the checks with their thresholds, and profiles
that scale the draw budgets::

    model: digits_model:load_model        # "module:callable"; the module is imported from the
    model_args: {name: standard}          #   suite's folder or sys.path, called with model_args
    data: digits_factories:held_out       # returns (x, y), a Dataset or a DataLoader
    settings: {confidence: 0.95}          # suite-wide settings: settings.KEYS but model, data,
                                          #   profile and report (see NOT_IN_SUITES)
    profiles:                             # chosen with --robust-profile NAME; default: ci if defined
      smoke: {budget_scale: 0.1, inconclusive: skip}
      ci: {budget_scale: 1}
      nightly: {budget_scale: 10}
    checks:
      - name: uniform-0.1                 # the test id: robust_digits.yaml::uniform-0.1
        tsrm: 0.95                        # a metric and its threshold, as on a robust marker
        perturbation: {UniformLinf: {eps: 0.1}}
        budget: 20000                     # per-check settings
      - name: noise-trained
        model_args: {name: noise}         # per-check model (or data) factory and arguments
        tsrm: 0.9
        perturbation: {UniformLinf: {eps: 0.3}}
      - name: q100
        profiles: [nightly]               # runs only under these profiles (skipped otherwise)
        q: 100
        max_loss: 0.5

A check takes the same keywords as a ``robust`` marker (``checks.spec.parse_marker``); a perturbation
is written ``{Name: {param: value}}`` or ``Name``, where Name is a built-in perturbation or one
that a ``pytest_robust_perturbations`` hook adds. Settings resolve with the one precedence of
``settings.keys.PRECEDENCE``: defaults < ini < --robust-config < the suite's ``settings`` < the
selected profile's settings < the command line < the check's own keys; the resulting budget is
then multiplied by the profile's ``budget_scale`` (rounded, at least 1), except a budget given on
the command line and not by the check itself, which is used as given (a smoke job's
``--robust-budget 300`` means 300). A suite without ``profiles`` runs every check at scale 1 whatever profile
is chosen; a suite with ``profiles`` must define the chosen one.

Everything but the factory calls is checked at collection (which imports the factories'
modules, and so torch): a malformed suite is a collection error of its file (the run stops
with exit code 2 before any test runs) whose message names the file, the line and the key, e.g.
``robust_digits.yaml:14: checks[1].perturbation: unknown perturbation 'Uniform'; known: ...``.
Check indices count from 0. The model and data factories are called when the file's first test
runs (once per file and device); a factory that raises fails the file's tests, with the same
location and the factory's own traceback.

The parts: ``document`` (YAML with line numbers), ``schema`` (keys, profiles, factories; ``load_suite``)
and ``nodes`` (the pytest collector and items).
"""
