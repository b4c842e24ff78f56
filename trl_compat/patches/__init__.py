"""The patches, one module each. A new patch is one module here plus its tests."""

from trl_compat.patches import peft_optional, zero3_hooks_api, zero3_unwrap

PATCHES = [
    peft_optional.PATCH,
    zero3_unwrap.PATCH,  # before zero3-hooks-api: its add_hooks guard goes under
    zero3_hooks_api.PATCH,
]
