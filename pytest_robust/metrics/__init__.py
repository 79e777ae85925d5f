"""The robustness metrics; each module exposes one function returning a ``Result``."""
