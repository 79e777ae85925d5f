"""Cheap inspections of what a user hands a check: the model (``model``), the data (``data``) and the
perturbation (``perturbation``), plus where their warnings are shown (``warnings``).

Each function looks for one common mistake and either raises an error that names the mistake and
its fix (``RobustDataError`` / ``RobustModelError`` / ``TypeError``) or, where the tool cannot be
sure, issues a ``RobustWarning``.
"""
