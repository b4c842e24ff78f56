"""TRL and torch know-how that several patches share: reading TRL's source for probes, peeling
model wrappers, ZeRO-3 gathering, log-prob call sites, the one ``GRPOTrainer.__init__`` wrapper,
the vLLM weight sync and the prompt handoff. No patch decisions live here (those are in
``patches/``), and nothing here knows the engine's bookkeeping (that is ``_engine/``)."""
