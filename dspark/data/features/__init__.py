"""Offline target features: layout, cache writer, reader."""
