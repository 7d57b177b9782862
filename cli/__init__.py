"""The ``switchyard`` command line: the top layer, dispatching to the services, the load
generator and the research tools (each imported only by the command that runs it)."""
