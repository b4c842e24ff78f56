"""The patches, one module each. A new patch is one module here plus its tests."""

PATCHES = []
