"""The ``switchyard`` command's exit statuses (besides 0, and 130 on Ctrl-C)."""

EXIT_UNAVAILABLE = 1
"""A service, the broker or the store could not do what the command needed."""

EXIT_CONFIG = 2
"""Bad configuration or bad input, named in one line on standard error."""
