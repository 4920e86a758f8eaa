"""NVML errors with pynvml's codes, class names and behaviour.

pynvml raises ``NVMLError_<CamelCase>`` subclasses chosen by return code; ``.value`` holds the code
and equality compares codes. Only ``agent/nvml/real.py`` may import pynvml, so this module mirrors the
same hierarchy for the rest of the project: the real backend translates pynvml's errors into these
(``from_code``), and the simulator raises them directly. Code that handles NVML errors catches these.
"""

from __future__ import annotations

import string
from typing import ClassVar

# name -> code, as in nvidia-ml-py 13.615.71
CODES: dict[str, int] = {
    "UNINITIALIZED": 1,
    "INVALID_ARGUMENT": 2,
    "NOT_SUPPORTED": 3,
    "NO_PERMISSION": 4,
    "ALREADY_INITIALIZED": 5,
    "NOT_FOUND": 6,
    "INSUFFICIENT_SIZE": 7,
    "INSUFFICIENT_POWER": 8,
    "DRIVER_NOT_LOADED": 9,
    "TIMEOUT": 10,
    "IRQ_ISSUE": 11,
    "LIBRARY_NOT_FOUND": 12,
    "FUNCTION_NOT_FOUND": 13,
    "CORRUPTED_INFOROM": 14,
    "GPU_IS_LOST": 15,
    "RESET_REQUIRED": 16,
    "OPERATING_SYSTEM": 17,
    "LIB_RM_VERSION_MISMATCH": 18,
    "IN_USE": 19,
    "MEMORY": 20,
    "NO_DATA": 21,
    "VGPU_ECC_NOT_SUPPORTED": 22,
    "INSUFFICIENT_RESOURCES": 23,
    "FREQ_NOT_SUPPORTED": 24,
    "ARGUMENT_VERSION_MISMATCH": 25,
    "DEPRECATED": 26,
    "NOT_READY": 27,
    "GPU_NOT_FOUND": 28,
    "INVALID_STATE": 29,
    "RESET_TYPE_NOT_SUPPORTED": 30,
    "UNKNOWN": 999,
}

_MESSAGES: dict[int, str] = {
    1: "Uninitialized",
    2: "Invalid Argument",
    3: "Not Supported",
    4: "Insufficient Permissions",
    5: "Already Initialized",
    6: "Not Found",
    7: "Insufficient Size",
    8: "Insufficient External Power",
    9: "Driver Not Loaded",
    10: "Timeout",
    11: "Interrupt Request Issue",
    12: "NVML Shared Library Not Found",
    13: "Function Not Found",
    14: "Corrupted infoROM",
    15: "GPU is lost",
    16: "GPU requires restart",
    17: "The operating system has blocked the request.",
    18: "RM has detected an NVML/RM version mismatch.",
    19: "In Use",
    20: "Insufficient Memory",
    21: "No Data",
    22: "vGPU ECC Not Supported",
    23: "Insufficient Resources",
    24: "Frequency Not Supported",
    25: "Argument Version Mismatch",
    26: "Deprecated",
    27: "Not Ready",
    28: "GPU Not Found",
    29: "Invalid State",
    30: "Reset Type Not Supported",
    999: "Unknown Error",
}


class NVMLError(Exception):
    """Base of every NVML error; ``NVMLError(code)`` returns the subclass for that code."""

    _by_code: ClassVar[dict[int, type[NVMLError]]] = {}
    value: int

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._by_code.get(value, NVMLError)  # noqa: PLW0642 - pynvml's dispatch
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"Unknown Error (code {self.value})")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __reduce__(self) -> tuple[type[NVMLError], tuple[int]]:
        return (NVMLError, (self.value,))

    @property
    def name(self) -> str:
        """The code's name without prefix, e.g. ``GPU_IS_LOST``."""
        for name, code in CODES.items():
            if code == self.value:
                return name
        return f"CODE_{self.value}"


def _make(name: str, code: int) -> type[NVMLError]:
    class_name = "NVMLError_" + string.capwords(name, "_").replace("_", "")

    def __new__(cls: type[NVMLError], value: int = code) -> NVMLError:  # noqa: N807
        obj = Exception.__new__(cls)
        obj.value = code
        return obj

    def __init__(self: NVMLError, value: int = code) -> None:  # noqa: N807
        Exception.__init__(self, code)
        self.value = code

    cls = type(class_name, (NVMLError,), {"__new__": __new__, "__init__": __init__})
    cls.__module__ = __name__
    NVMLError._by_code[code] = cls
    return cls


NVMLError_Uninitialized = _make("UNINITIALIZED", 1)
NVMLError_InvalidArgument = _make("INVALID_ARGUMENT", 2)
NVMLError_NotSupported = _make("NOT_SUPPORTED", 3)
NVMLError_NoPermission = _make("NO_PERMISSION", 4)
NVMLError_AlreadyInitialized = _make("ALREADY_INITIALIZED", 5)
NVMLError_NotFound = _make("NOT_FOUND", 6)
NVMLError_InsufficientSize = _make("INSUFFICIENT_SIZE", 7)
NVMLError_InsufficientPower = _make("INSUFFICIENT_POWER", 8)
NVMLError_DriverNotLoaded = _make("DRIVER_NOT_LOADED", 9)
NVMLError_Timeout = _make("TIMEOUT", 10)
NVMLError_IrqIssue = _make("IRQ_ISSUE", 11)
NVMLError_LibraryNotFound = _make("LIBRARY_NOT_FOUND", 12)
NVMLError_FunctionNotFound = _make("FUNCTION_NOT_FOUND", 13)
NVMLError_CorruptedInforom = _make("CORRUPTED_INFOROM", 14)
NVMLError_GpuIsLost = _make("GPU_IS_LOST", 15)
NVMLError_ResetRequired = _make("RESET_REQUIRED", 16)
NVMLError_OperatingSystem = _make("OPERATING_SYSTEM", 17)
NVMLError_LibRmVersionMismatch = _make("LIB_RM_VERSION_MISMATCH", 18)
NVMLError_InUse = _make("IN_USE", 19)
NVMLError_Memory = _make("MEMORY", 20)
NVMLError_NoData = _make("NO_DATA", 21)
NVMLError_VgpuEccNotSupported = _make("VGPU_ECC_NOT_SUPPORTED", 22)
NVMLError_InsufficientResources = _make("INSUFFICIENT_RESOURCES", 23)
NVMLError_FreqNotSupported = _make("FREQ_NOT_SUPPORTED", 24)
NVMLError_ArgumentVersionMismatch = _make("ARGUMENT_VERSION_MISMATCH", 25)
NVMLError_Deprecated = _make("DEPRECATED", 26)
NVMLError_NotReady = _make("NOT_READY", 27)
NVMLError_GpuNotFound = _make("GPU_NOT_FOUND", 28)
NVMLError_InvalidState = _make("INVALID_STATE", 29)
NVMLError_ResetTypeNotSupported = _make("RESET_TYPE_NOT_SUPPORTED", 30)
NVMLError_Unknown = _make("UNKNOWN", 999)

# Errors after which a GPU must be treated as gone until it answers again.
LOST_CODES = frozenset({15, 28, 16})
