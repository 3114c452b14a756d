"""`speculative`: draft-model speculative decoding (Leviathan et al. 2023, Chen et al. 2023). The method is described in plugin.py.

This file imports only the torch-free config; every other name (the plugin class, its rule, drafter and
decoder) loads from plugin.py on first use, so the CLI checks `--set` against the config before torch loads."""

from mmspec.common.lazy import lazy_exports

from .config import SpeculativeConfig  # noqa: F401  (re-exported)

__getattr__ = lazy_exports(__name__, "plugin")
