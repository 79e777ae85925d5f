"""The evaluation engine: everything around a check's numbers, written once. ``run.Run`` (one check's context:
data, device, dtype, the guarded model, the budget, the Result), data reading (``data``), devices
(``device``), precision (``precision``), the model's outputs and normalization (``interface``), the
guarded forward pass with out-of-memory back-off (``forward``, ``guard``), random streams
(``streams``), cross-rank traffic (``collective``), host-read counting (``host_syncs``), the fit
cache (``cache``), live progress (``progress``), the worst-input gallery (``gallery``) and the
inspections of what users hand over (``inspect``). Nothing here knows about any particular check.
"""
