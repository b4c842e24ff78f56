"""The guard's checks, one module each: prompts (P), sampling (S), engine_calls (C), weights (W1, W2),
logprobs (L). Each reports through ``trl_compat.guard._alarms.LEDGER``."""
