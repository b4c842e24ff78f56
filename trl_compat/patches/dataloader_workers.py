"""dataloader-workers: GRPOTrainer trains with ``dataloader_num_workers >= 1``.

Main-branch builds: 0.19.0.dev0 builds from before PR #3568 have the bug too.

The bugs (TRL issues #3544, #2979, #3567; fixed by PR #3568 in 0.18.2 and 0.19.0):

a) TRL 0.17.0 - 0.18.1 override ``get_train_dataloader`` and pass transformers'
   ``seed_worker`` itself as ``worker_init_fn``. transformers 4.52 (PR #37980) made it
   ``seed_worker(worker_id, num_workers, rank)``, so every worker dies on start and
   ``train()`` raises ``TypeError: Caught TypeError in DataLoader worker process 0``, from
   ``seed_worker() missing 2 required positional arguments: 'num_workers' and 'rank'``.
   TRL 0.18.2 passes ``partial(seed_worker, num_workers=..., rank=args.process_index)``.
b) TRL 0.14.0 - 0.18.1 hand the Trainer a collator defined inside ``GRPOTrainer.__init__``.
   Workers started by *spawn* (the default on macOS and Windows, or
   ``multiprocessing.set_start_method("spawn")``) receive the collator pickled, and a local
   function cannot be: ``AttributeError: Can't pickle local object
   'GRPOTrainer.__init__.<locals>.data_collator'``. TRL 0.18.2 uses a module-level ``identity``.

Where it shows: a) TRL 0.17.0 - 0.18.1 with transformers >= 4.52; b) TRL 0.14.0 - 0.18.1 with spawn
workers; and main-branch builds up to PR #3568 (0.19.0.dev0).

Probe (each part separately): a) GRPOTrainer defines its own ``get_train_dataloader`` whose
source sets ``worker_init_fn`` to the bare ``seed_worker`` (no ``partial(seed_worker``), and the
``seed_worker`` it names cannot be called with the worker id alone; b) the source of
``GRPOTrainer.__init__`` defines ``def data_collator(features)``.

Fix: a) while TRL's ``get_train_dataloader`` runs, the ``seed_worker`` it names is
``partial(seed_worker, num_workers=args.dataloader_num_workers, rank=args.process_index)``,
TRL 0.18.2's own argument; b) after ``GRPOTrainer.__init__``, TRL's local collator on the
instance is replaced by this module's ``identity`` (the same function: features in, features
out), which pickles by name.

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: trl_compat no longer supports TRL < 0.18.2 (the registry's ``remove_when``; a test
holds the two equal).
"""

from __future__ import annotations

import functools
import inspect
import threading

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code, defining_class
from trl_compat._helpers.trainer_init import around_init

PATCH_ID = "dataloader-workers"

BARE_SEED_WORKER = 'dataloader_params["worker_init_fn"] = seed_worker'
LOCAL_COLLATOR = "def data_collator(features):"
LOCAL_COLLATOR_QUALNAME = "GRPOTrainer.__init__.<locals>.data_collator"


def identity(features):
    """GRPO's collator: no collation (TRL 0.18.2's ``trl.trainer.grpo_trainer.identity``)."""
    return features


def _needs_worker_args(function) -> bool:
    try:
        inspect.signature(function).bind(0)
    except TypeError:
        return True
    return False


def _seed_worker_finding(module):
    """``(needed, reason)`` of part a; needed None: cannot tell."""
    owner = defining_class(module.GRPOTrainer, "get_train_dataloader")
    if owner is None or owner.__module__ != module.__name__:
        return False, "GRPOTrainer uses transformers' get_train_dataloader"
    source = code(vars(owner)["get_train_dataloader"])
    if "worker_init_fn" not in source or "partial(seed_worker" in source:
        return False, "GRPOTrainer.get_train_dataloader passes seed_worker its arguments"
    if BARE_SEED_WORKER not in source:
        return None, "GRPOTrainer.get_train_dataloader sets worker_init_fn in a form trl_compat does not know"
    seed_worker = getattr(module, "seed_worker", None)
    if seed_worker is None:
        return None, "GRPOTrainer.get_train_dataloader names a seed_worker its module does not have"
    if not _needs_worker_args(seed_worker):
        return False, "GRPOTrainer.get_train_dataloader passes the bare seed_worker, which takes the worker id alone"
    return True, (
        f"GRPOTrainer.get_train_dataloader passes the bare seed_worker{inspect.signature(seed_worker)} "
        "as worker_init_fn: every DataLoader worker dies with TypeError"
    )


def _collator_finding(module):
    if LOCAL_COLLATOR in code(module.GRPOTrainer.__init__):
        return True, ("GRPOTrainer.__init__ gives the Trainer a local data_collator, which spawn workers cannot unpickle")
    return False, "GRPOTrainer's collator is no local function"


def probe(module):
    findings = [_seed_worker_finding(module), _collator_finding(module)]
    if any(found for found, _ in findings):
        return needed("; ".join(reason for found, reason in findings if found))
    if any(found is None for found, _ in findings):
        return undecided("; ".join(reason for found, reason in findings if found is None))
    return not_needed("; ".join(reason for _, reason in findings))


_swap_lock = threading.RLock()


def _get_train_dataloader_factory(module):
    def factory(original):
        @functools.wraps(original)
        def get_train_dataloader(self, *args, **kwargs):
            bare = module.seed_worker
            args_ = self.args
            with _swap_lock:
                # TRL's method reads the module global at call time: give it TRL 0.18.2's argument.
                module.seed_worker = functools.partial(bare, num_workers=args_.dataloader_num_workers, rank=args_.process_index)
                try:
                    return original(self, *args, **kwargs)
                finally:
                    module.seed_worker = bare

        return get_train_dataloader

    return factory


def _replace_local_collator(trainer, arguments) -> None:
    collator = getattr(trainer, "data_collator", None)
    if getattr(collator, "__qualname__", "").endswith(LOCAL_COLLATOR_QUALNAME):
        trainer.data_collator = identity


def apply(module, patcher):
    cls = module.GRPOTrainer
    seed_worker, _ = _seed_worker_finding(module)
    collator, _ = _collator_finding(module)
    if seed_worker:
        patcher.wrap(cls, "get_train_dataloader", _get_train_dataloader_factory(module))
    if collator:
        around_init(after=_replace_local_collator)(module, patcher)
    if not (seed_worker or collator):  # the probe said otherwise a moment ago
        raise RuntimeError("neither part of the bug found")
