"""The guard's checks (floor 2), one module each: prompts (P), sampling (S), engine_calls (C),
weights and watched (W1, W2), logprobs and logprobs_gate (L). Functions of (run, engine record,
observation) with no module state; each alarm is fired through its run with the step it belongs to."""
