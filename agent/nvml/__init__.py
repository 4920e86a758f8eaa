"""NVML access: the narrow ``NvmlBackend`` protocol, pynvml-compatible errors, the real backend
(``real``, the only importer of ``pynvml``) and the embedded simulator (``fake`` + machine presets)."""
