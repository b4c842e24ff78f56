"""A 3-step GRPO run on the CPU with trl_compat, on a tiny model built in code.

In your own script the only change is the first import. A real run would load a
model from the Hub; nothing can be downloaded here, so the model and tokenizer
are built in code by the test fixtures (``tests/support/tiny.py``).
"""

import logging
import os
import sys
import tempfile

import trl_compat  # first or after trl: both work

logging.basicConfig(level=logging.WARNING, format="%(message)s")
logging.getLogger("trl_compat").setLevel(logging.INFO)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "support"))
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

import tiny  # noqa: E402


def main():
    with tempfile.TemporaryDirectory() as workdir:
        model_dir = tiny.save_tiny(os.path.join(workdir, "tiny-qwen2"), "qwen2")
        config = GRPOConfig(
            output_dir=os.path.join(workdir, "out"), max_steps=3, per_device_train_batch_size=4,
            num_generations=2, max_prompt_length=16, max_completion_length=8, learning_rate=1e-3,
            logging_steps=1, report_to="none", save_strategy="no", bf16=False, seed=0,
        )
        trainer = GRPOTrainer(
            model=model_dir, reward_funcs=tiny.varying_reward, args=config,
            train_dataset=tiny.prompt_dataset(8), processing_class=tiny.make_tokenizer(),
        )
        trainer.train()
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        print(f"GRPO finished {trainer.state.global_step} steps; losses {losses}")
        records = trl_compat.report()
        width = max(len(rec.id) for rec in records)
        for rec in records:
            print(f"  {rec.id:<{width}}  {rec.status:<10}  {rec.reason}")


if __name__ == "__main__":
    main()
