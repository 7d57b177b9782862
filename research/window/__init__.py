"""The window simulator over :mod:`switchyard.selection`'s window schedulers: runs,
the paper's sweeps, plots, and the ``switchyard window`` and ``switchyard accuracy``
commands."""
