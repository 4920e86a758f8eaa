"""Benchmark harnesses, one module per ``gpu-node-agent bench`` target.

Each harness builds what it measures from the libraries (``deviceplugin``, ``scheduler_plugin``,
``topology``) and the node side, and prints its figures beside the machine it ran on (``machine``).
The libraries import nothing from here.
"""
