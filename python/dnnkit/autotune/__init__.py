"""Choosing algorithms: measured tuning (tuner.py), the cost model (cost_model.py), the persistent cache
(cache.py) and the layer lists tuning runs over (models.py)."""
from .cache import Store, cache_dir, cache_path, default_store, device_fingerprint
from .cost_model import measure_ceilings, predict
from .records import TuneRecord, TuneResult
from .tuner import DEFAULT_BUDGET_S, find

__all__ = ["find", "TuneRecord", "TuneResult", "DEFAULT_BUDGET_S", "predict", "measure_ceilings", "Store",
           "default_store", "cache_dir", "cache_path", "device_fingerprint"]
