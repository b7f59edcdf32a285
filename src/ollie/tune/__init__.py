"""On-device measurement and the persistent cost cache."""

from ollie.tune.cache import CostCache, default_cache_dir
from ollie.tune.measure import measure

__all__ = ["CostCache", "default_cache_dir", "measure"]
