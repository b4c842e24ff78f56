"""What the trainer module gets in place of the PEFT names it uses without peft installed:
classes nobody is an instance of, a ``get_peft_model`` that raises, and the check of
``peft_config`` before TRL's ``__init__`` does any work. Each error names the fix."""

from __future__ import annotations

# A release of your stack's day: the newest peft may want a newer transformers or torch.
INSTALL_HINT = "`pip install peft` (a release of your transformers' day, e.g. peft 0.14 or 0.15 for TRL 0.14-0.16)"


def _message(what: str) -> str:
    return (
        f"{what} needs PEFT, which is not installed. Install it with {INSTALL_HINT} and restart Python. "
        "Without peft_config, GRPO trains the full model and needs no PEFT. "
        "(Raised by trl_compat's peft-optional patch; TRL itself would fail with a NameError.)"
    )


class _Unavailable(type):
    """Metaclass of the stand-in classes: any class attribute (e.g.
    ``PeftModel.from_pretrained``) raises the ImportError that names the fix."""

    def __getattr__(cls, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise ImportError(_message(f"{cls.__name__}.{attr}"), name="peft")


def _unavailable_class(name: str) -> type:
    def __new__(cls, *args, **kwargs):
        raise ImportError(_message(name), name="peft")

    # A class that is never instantiated: isinstance(x, it) is False for every x.
    return _Unavailable(
        name,
        (),
        {
            "__new__": __new__,
            "__module__": __name__,
            "__qualname__": f"unavailable.{name}",
            "__doc__": f"Stand-in for peft.{name} while peft is not installed; nothing is an instance of it.",
        },
    )


PeftModelUnavailable = _unavailable_class("PeftModel")
PeftConfigUnavailable = _unavailable_class("PeftConfig")


def get_peft_model_unavailable(model, peft_config, *args, **kwargs):
    raise ImportError(_message("get_peft_model"), name="peft")


def stand_in(name: str):
    """The stand-in bound into the trainer module for the missing PEFT ``name``."""
    return {
        "PeftModel": PeftModelUnavailable,
        "PeftConfig": PeftConfigUnavailable,
        "get_peft_model": get_peft_model_unavailable,
    }[name]


def refuse_peft_config(trainer, arguments) -> None:
    """Before TRL's ``__init__`` loads the model (nothing is lost yet): ``peft_config`` needs peft."""
    if arguments.get("peft_config") is not None:
        raise ImportError(_message(f"{type(trainer).__name__}(peft_config=...)"), name="peft")
