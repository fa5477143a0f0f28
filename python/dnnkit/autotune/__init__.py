"""Choosing algorithms: the cost model (cost_model.py); measured tuning and its cache come next."""
from .cost_model import predict

__all__ = ["predict"]
