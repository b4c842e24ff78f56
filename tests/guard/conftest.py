import pytest


@pytest.fixture
def guard():
    """The off-policy guard on (kept strict if TRL_COMPAT_GUARD=strict set it so), alarms not raised
    inside the test; yields a function returning the alarms raised since the test began."""
    from trl_compat import guard as offpolicy

    before_mode = offpolicy.mode()
    if before_mode == "off":
        offpolicy.enable()
    seen = len(offpolicy.alarms())
    with offpolicy.observing():
        yield lambda: offpolicy.alarms()[seen:]
    if before_mode == "off":
        offpolicy.disable()
