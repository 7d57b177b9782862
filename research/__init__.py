"""Switchyard's research tools: the simulators, sweeps, reports and experiment commands.

No service imports this package and no service image contains it
(``deploy/docker/Dockerfile`` copies ``shared``, ``services``, ``loadgen`` and ``cli``
only). Each part sits beside the policy family it runs:

- :mod:`research.llm`: the discrete-event LLM cluster simulator over the assignment
  policies of :mod:`switchyard.policies` (``switchyard simulate``), and the agreement
  between that simulator and the live stack.
- :mod:`research.window`: the window simulator over the window schedulers of
  :mod:`switchyard.selection` (``switchyard window``, ``switchyard accuracy``).
- :mod:`research.multimodel`: the multi-model simulator over the placement policies of
  :mod:`switchyard.multimodel` (``switchyard multimodel``).
- :mod:`research.report`: run records, tables, plots and HTML pages of those commands.
"""
