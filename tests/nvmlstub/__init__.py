"""The C-level NVML stand-in (``libnvidia-ml.so.1`` built from ``nvmlstub.c``) and its contract suite."""
