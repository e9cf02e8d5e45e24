"""One body for numpy and torch: the array namespace of a rule's inputs (array API standard).

A rule that declares ``array_api = True`` writes its methods against ``xp =
arrays.namespace(target_probs, draft_probs)`` and calls only ``xp.*`` (the array API
standard, through ``array_api_compat``): the same definition then runs on float64 numpy
rows (the exact reference) and, unchanged, on torch tensors on any device (the torch
sampler and the decoder call it with float64 tensors; nothing is copied between devices).

The base families' own methods (``rules.base``) are written this way, so a rule that
only supplies its formula in ``xp`` gets every other method on both backends.

``namespace`` returns ``array_api_compat.numpy`` at once when every input is a numpy array
(no inspection cost on the numpy hot paths), else ``array_api_compat.array_namespace``,
which refuses to mix numpy and torch inputs.
"""

from __future__ import annotations

import array_api_compat
import array_api_compat.numpy as numpy_namespace
import numpy as np


def namespace(*arrays: object):
    """The array API namespace of ``arrays`` (None entries are skipped)."""
    present = [array for array in arrays if array is not None]
    if all(isinstance(array, np.ndarray | np.generic | float | int) for array in present):
        return numpy_namespace
    return array_api_compat.array_namespace(*present)


def device(array: object):
    """The device of ``array`` (``"cpu"`` for numpy), for ``xp.arange(..., device=...)``."""
    return array_api_compat.device(array)


def is_numpy(array: object) -> bool:
    """True for numpy arrays (and numpy scalars)."""
    return isinstance(array, np.ndarray | np.generic)


def to_numpy(array: object) -> np.ndarray:
    """A float64 numpy copy of a numpy array or a torch tensor (any device)."""
    if is_numpy(array):
        return np.asarray(array)
    return np.asarray(array_api_compat.to_device(array, "cpu"))


def kth_largest(values, k: int):
    """The k-th largest entry of each row [..., V] -> [..., 1] (the row's minimum when
    k >= V), in the rows' namespace: ``np.partition`` for numpy (O(V)), ``topk`` for torch
    (the array API standard has no selection, and a full sort is O(V log V))."""
    size = values.shape[-1]
    place = min(k, size)
    if is_numpy(values):
        return -np.partition(-values, place - 1, axis=-1)[..., place - 1 : place]
    if array_api_compat.is_torch_array(values):
        return values.topk(place, dim=-1).values[..., place - 1 : place]
    xp = namespace(values)
    return xp.sort(values, axis=-1, descending=True)[..., place - 1 : place]


def distinct_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first [G], group [R]) for numpy rows [R, W]: the index of the first row of each
    distinct row, in the order ``np.unique(rows, axis=0)`` sorts them, and the group of
    every row, so that per-row work on repeated rows is done once (``work(rows[first])
    [group]``). Rows repeated in runs, as the law engine repeats a node's row over its
    drafted tuples, cost one comparison with their neighbour: only the first row of each
    run is sorted."""
    count = rows.shape[0]
    if count == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    starts = np.flatnonzero(np.concatenate([[True], np.any(rows[1:] != rows[:-1], axis=-1)]))
    _, head, where = np.unique(rows[starts], axis=0, return_index=True, return_inverse=True)
    group = np.repeat(where.reshape(-1), np.diff(np.append(starts, count)))  # [R]
    return starts[head], group
