"""Running a block of a test on the code trl_compat replaces."""

import contextlib


@contextlib.contextmanager
def without_patch(patch_id):
    """Run a block on the unpatched code, then put the patch back.

    The patch must have been applied before (tests assert that first), so the
    block really exercises the code trl_compat replaces."""
    import trl_compat
    from trl_compat import guard

    assert trl_compat.status(patch_id) == trl_compat.APPLIED, trl_compat.report()
    trl_compat.revert(patch_id)
    try:
        # the bug is wanted here: the off-policy guard (TRL_COMPAT_GUARD=strict in the matrix)
        # logs and counts what it finds but does not stop the run
        with guard.observing():
            yield
    finally:
        trl_compat.install(patch_id)
        assert trl_compat.status(patch_id) == trl_compat.APPLIED, trl_compat.report()
