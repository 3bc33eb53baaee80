"""Run an ``nvwc sweep`` on a Ray cluster (see ``nvwc_ray.driver``)."""

from .driver import list_cells, run_sweep

__all__ = ["list_cells", "run_sweep"]
