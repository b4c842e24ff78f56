"""One short GRPO run on the CPU, as a user's script would write it, on a tiny model built in code.

``examples/grpo_cpu.py`` runs this script twice per fix: once with the fix switched off
(``TRL_COMPAT_DISABLE=<id>``), once with it on. To run it alone::

    python examples/tiny_grpo.py pad-token            # or: logps-temperature

It ends with one line ``RESULT {...}`` (JSON): the versions, the fix's status, the error if
training crashed, and the per-step metrics TRL logged.

Nothing is downloaded: a real script would load a model and tokenizer from the Hub, here both are
built in code (a random 2-layer Qwen2 and a word-level tokenizer), so the run takes seconds.
"""

import inspect
import json
import sys
import tempfile

import trl_compat  # the one line a script needs, before or after `import trl`

import torch
from datasets import Dataset
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from trl import GRPOConfig, GRPOTrainer

# Lowercase two-syllable words ("baba", "babe", ...): a vocabulary the tokenizer can split on spaces.
SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
WORDS = [a + b for a in SYLLABLES for b in SYLLABLES][:509]


def make_tokenizer(with_pad_token=True):
    # GPT-2 and the Llama-3 base models ship without a pad token: with_pad_token=False is them.
    vocab = {word: i for i, word in enumerate(["<pad>", "</s>", "<unk>", *WORDS])}
    backend = Tokenizer(WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="</s>", unk_token="<unk>", pad_token="<pad>" if with_pad_token else None
    )
    tokenizer.padding_side = "left"  # GRPO generates: prompts are padded on the left
    tokenizer.model_input_names = ["input_ids", "attention_mask"]  # no token_type_ids: TRL 0.14 hands them to generate
    return tokenizer


def make_model():
    config = Qwen2Config(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
        max_position_embeddings=128,
        pad_token_id=0,
        eos_token_id=1,
    )
    torch.manual_seed(0)  # the same random model in the "before" and the "after" run
    return Qwen2ForCausalLM(config)


def prompts(n=8):
    # Prompts of 2 to 5 words, so that every batch needs padding.
    texts = [" ".join(WORDS[7 * i + 3 * j] for j in range(2 + i % 4)) for i in range(n)]
    return Dataset.from_dict({"prompt": texts})


def reward_letters(completions, **kwargs):
    # Any reward that differs between the completions of a prompt will do: GRPO learns from the differences.
    return [text.count("a") + 0.5 * text.count("o") for text in completions]


def record_logps_temperature(trainer, found):
    """Find, by value, the temperature at which TRL computed the log-probs it trains on.

    TRL samples completions at ``args.temperature``. Its log-probs of those tokens should be
    ``log_softmax(logits / temperature)``; each call is compared with that formula at every
    temperature from 0.50 to 1.50 and the one that matches is appended to ``found``.
    """
    compute = trainer._get_per_token_logps  # TRL's own method, with trl_compat's fix when it is on
    signature = inspect.signature(compute)

    def spy(*args, **kwargs):
        logps = compute(*args, **kwargs)
        call = signature.bind(*args, **kwargs).arguments
        keep = call["logits_to_keep"]
        with torch.no_grad():  # a plain forward of the same model on the same ids
            logits = call["model"](input_ids=call["input_ids"], attention_mask=call["attention_mask"]).logits
        logits = logits[:, -keep - 1 : -1].float()  # the logits that predicted the completion's tokens
        tokens = call["input_ids"][:, -keep:, None]
        error = {
            t / 100: (logits.div(t / 100).log_softmax(-1).gather(-1, tokens)[..., 0] - logps).abs().max().item()
            for t in range(50, 151, 5)
        }
        found.append(min(error, key=error.get))
        return logps

    trainer._get_per_token_logps = spy


def main(fix):
    import transformers
    import trl

    result = {
        "fix": fix,
        "trl": trl.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "error": None,
        "steps": [],
    }
    with tempfile.TemporaryDirectory() as output_dir:
        args = GRPOConfig(
            output_dir=output_dir,
            max_steps=3,
            per_device_train_batch_size=4,
            num_generations=2,
            max_prompt_length=16,
            max_completion_length=8,
            learning_rate=1e-3,
            seed=0,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
        )
        trainer = GRPOTrainer(
            model=make_model(),
            reward_funcs=reward_letters,
            args=args,
            train_dataset=prompts(),
            processing_class=make_tokenizer(with_pad_token=fix != "pad-token"),
        )
        result["status"] = trl_compat.status(fix)  # read once the trainer is built: its patches have settled
        result["sampling_temperature"] = args.temperature
        found = []
        if fix == "logps-temperature":
            record_logps_temperature(trainer, found)
        try:
            trainer.train()
        except Exception as error:  # noqa: BLE001  (any crash is the "before" run's result to show)
            result["error"] = f"{type(error).__name__}: {str(error).splitlines()[0]}"
        result["steps"] = [
            {key: entry.get(key) for key in ("loss", "grad_norm", "kl", "reward")}
            for entry in trainer.state.log_history
            if "loss" in entry
        ]
        result["logps_temperatures"] = sorted(set(found))
        result["pad_token"] = trainer.processing_class.pad_token
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
