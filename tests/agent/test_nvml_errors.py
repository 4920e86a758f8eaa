from __future__ import annotations

import pickle

import pytest

from agent.nvml import errors


@pytest.mark.parametrize(
    ("code", "cls_name"),
    [
        (3, "NVMLError_NotSupported"),
        (15, "NVMLError_GpuIsLost"),
        (18, "NVMLError_LibRmVersionMismatch"),
        (999, "NVMLError_Unknown"),
    ],
)
def test_code_selects_pynvml_named_subclass(code: int, cls_name: str) -> None:
    err = errors.NVMLError(code)
    assert type(err).__name__ == cls_name
    assert err.value == code
    assert isinstance(err, errors.NVMLError)


def test_subclass_without_argument_carries_its_code_and_compares_by_code() -> None:
    err = errors.NVMLError_GpuIsLost()
    assert err.value == 15
    assert err == errors.NVMLError(15)
    assert err != errors.NVMLError_NotFound()
    assert str(err) == "GPU is lost"
    assert err.name == "GPU_IS_LOST"


def test_unknown_code_stays_base_class_and_pickles() -> None:
    err = errors.NVMLError(4242)
    assert type(err) is errors.NVMLError
    assert "4242" in str(err)
    assert pickle.loads(pickle.dumps(errors.NVMLError_Timeout())) == errors.NVMLError_Timeout()
