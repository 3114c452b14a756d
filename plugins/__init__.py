"""Decoding plugins, one sub-package per method; each registers itself with @register_plugin."""
