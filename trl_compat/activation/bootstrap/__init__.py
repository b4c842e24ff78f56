"""The directory ``trl-compat run`` puts first on ``PYTHONPATH``: its ``sitecustomize.py``
activates trl_compat at interpreter start-up. A package only so that the wheel ships it;
nothing imports it as ``trl_compat.activation.bootstrap``."""
