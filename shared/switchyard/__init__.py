"""Switchyard: a scheduling control plane for multi-model inference.

The library every service imports: message contracts, the bus, the state store,
telemetry, the service runtime and (in later modules) the scheduling policies and
the simulator. Heavy numerical packages are imported lazily by the modules that need
them, never here.
"""

__version__ = "0.1.0"

from switchyard.native import install as _install_native_finder

# Before any submodule: the compiled forms of the hot modules load from a build of
# these very sources when one exists (switchyard.native).
_install_native_finder()
