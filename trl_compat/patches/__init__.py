"""The patches, one module each. A new patch is one module here plus its tests."""

from trl_compat.patches import peft_optional

PATCHES = [
    peft_optional.PATCH,
]
