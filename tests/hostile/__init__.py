"""The hostile-input suite: fault lines, configs, extender bodies, controller inputs, plan files and
HTTP abuse that must get a clear answer, bounded in time and memory, loopback only."""
