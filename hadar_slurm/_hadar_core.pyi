"""Type stub of the compiled Hadar core (``cython_core/hadar_core.pyx``).

Same signatures as :mod:`hadar_slurm.core.reference`; arrays of other layouts and integer or
boolean dtypes are converted (to C-contiguous float64 / int64) on the way in.
"""

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

def plan(
    remaining: F64, scale: I64, rate: F64, fill_rate: F64, ukey: F64, age: F64, sync: I64,
    current: I64, order: I64, capacity: I64, round_s: float, horizon: int, migration_s: float,
    price_floor: F64, price_ratio: float,
) -> tuple[I64, F64, I64]: ...
def balance_split(
    gpu_s: F64, capacity: I64, pi: F64, scale: I64, window: float, max_moves: int,
    level_to: float = 0.0,
) -> F64: ...
def drain_prices(
    remaining: F64, scale: I64, rate: F64, capacity: I64, iterations: int,
) -> tuple[float, F64]: ...
def match(
    node_type: I64, node_gpus: I64, counts: I64, order: I64,
    cur_job: I64, cur_node: I64, cur_count: I64,
) -> tuple[I64, I64, I64, I64]: ...
def pair_guests(
    order: I64, g_scale: I64, g_kind: I64, g_rem: F64, g_weight: F64, g_rate: F64,
    g_open: I64, g_partner: I64, g_start: F64, g_else: F64, g_behind: F64, g_cpus: I64,
    h_kind: I64, h_type: I64, h_scale: I64, h_may: I64, h_rp: F64, h_tp: F64, h_wp: F64,
    row_ptr: I64, row_node: I64, pair_host: F64, pair_guest: F64, cpus_left: I64,
    count_cpus: int, window: float, start_s: float,
) -> tuple[I64, I64, I64, I64]: ...
def upgrade_idle(
    alloc: I64, current: I64, worker_rate: F64, sync: I64 | npt.NDArray[np.bool_], order: I64,
    capacity: I64,
    round_s: float, migration_s: float,
) -> I64: ...
