"""Floor 3: where the guard's observations come from. Hooks on vLLM's ``LLM`` (:mod:`.vllm`), TRL's
``VLLMClient`` (:mod:`.client`), the trainer's log-prob function (:mod:`.loss`), transformers'
callbacks (:mod:`.callback`), set on single objects (:mod:`.instances`); the trainer a call is
made for is found by :mod:`.trainers`, the guard's only stack walk."""
