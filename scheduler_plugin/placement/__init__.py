"""The placement benchmark: an event-driven GPU-cluster simulator that runs one job stream through our
planner and through re-implementations of other schedulers' published placement algorithms, plus an
integer-program optimum on small instances.

Pure core (``cluster``, ``workloads`` given the data, ``sim``, ``metrics``, ``policies``, ``optimum``);
the command (``bench``) does the I/O. Imports nothing from ``agent`` or ``deviceplugin``.
"""
