"""TensorFlow's DataType codes (`TensorProto.dtype`) and the numpy dtypes they stand for:
what the writer puts in a tensor record and what a reader makes of it. Apart from the
protobuf messages (events.py) so that a reader decoding the wire bytes itself
(tensor_wire.py) does not build them."""

from __future__ import annotations

import ml_dtypes
import numpy as np

DT_FLOAT, DT_DOUBLE, DT_INT32, DT_UINT8, DT_INT16, DT_INT8, DT_STRING = 1, 2, 3, 4, 5, 6, 7
DT_INT64, DT_BOOL, DT_BFLOAT16, DT_UINT16, DT_HALF, DT_UINT32, DT_UINT64 = 9, 10, 14, 17, 19, 22, 23
DT_COMPLEX64, DT_COMPLEX128 = 8, 18

NUMPY_TO_DT = {
    np.dtype(np.float32): DT_FLOAT,
    np.dtype(np.float64): DT_DOUBLE,
    np.dtype(np.float16): DT_HALF,
    np.dtype(ml_dtypes.bfloat16): DT_BFLOAT16,
    np.dtype(np.int8): DT_INT8,
    np.dtype(np.int16): DT_INT16,
    np.dtype(np.int32): DT_INT32,
    np.dtype(np.int64): DT_INT64,
    np.dtype(np.uint8): DT_UINT8,
    np.dtype(np.uint16): DT_UINT16,
    np.dtype(np.uint32): DT_UINT32,
    np.dtype(np.uint64): DT_UINT64,
    np.dtype(np.bool_): DT_BOOL,
    np.dtype(np.complex64): DT_COMPLEX64,
    np.dtype(np.complex128): DT_COMPLEX128,
}
DT_TO_NUMPY = {dt: np_dtype for np_dtype, dt in NUMPY_TO_DT.items()}


def dtype_code(dtype: np.dtype) -> int:
    """TensorFlow DataType of a numpy dtype; strings are DT_STRING."""
    if dtype.kind in "USO":
        return DT_STRING
    try:
        return NUMPY_TO_DT[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"cannot save dtype {dtype}; supported: {', '.join(str(d) for d in NUMPY_TO_DT)} and strings") from None
