"""Offline target features: the per-row layout and size (`feature_layout`), the cache
writer (`feature_cache`) and its reader / training `Dataset` (`feature_dataset`)."""
