"""The registry: every patch, declared as data, in the order they stack.

Each entry is the whole declaration of one patch (the fields are documented on
``trl_compat._engine.patch.Patch``): what a user sees without it (``symptom``), what the fix does
(``summary``, ``upstream``), when it is due (``trigger``, the module whose import runs it;
``requires``, the version windows, and ``witnesses``, the versions the window tests feed through
the gate), what it may change (``changes``) and when to delete it (``remove_when``). The module
named by ``impl`` holds its probe and apply, with the docstring that traces the bug.
``import trl_compat`` reads only this table and gates it; a patch's module is imported when its
trigger module is, so a process that never imports TRL never loads a patch. A new patch is one
module (or a small package) here, one entry below, and its tests (named after its id).

Patches whose ``changes`` overlap stack in this order (the engine keeps it whatever order they
are installed and reverted in); the entries are grouped by subject, and a comment above an entry
says where it stacks when that is not plain. Fields most entries share are defaults (see
``Patch``): ``trigger`` the GRPO trainer's module, ``must_exist`` its ``GRPOTrainer``, ``impl``
the module named after the id; an entry spells them out only where it differs.
"""

from trl_compat._engine.patch import GRPO_MODULE as GRPO_MODULE  # the default trigger, named here for callers
from trl_compat._engine.patch import Patch
from trl_compat._engine.versions import affected

# The TRL releases this version of trl_compat knows: every patch's window and probe were checked
# against them (matrix/SWEEP.md). GRPOTrainer appeared in 0.14.0. `python -m trl_compat` says when
# the installed TRL lies outside.
OLDEST_KNOWN_TRL = "0.14.0"
NEWEST_KNOWN_TRL = "1.16.0"

# transformers5-use-cache's window (transformers5-import has its own since it reaches 0.28): TRL releases
# trl_compat supports (< 0.20, and the 0.20.0.dev0 builds that still carry 0.19's code) on transformers 5.
# (transformers5-warnings-issued has its own: its line lives on up to TRL 0.27.1.)
TRANSFORMERS5 = {"trl": affected("0.14.0", "0.20.0"), "transformers": affected("5.0.0")}
TRANSFORMERS5_REMOVE_WHEN = "trl_compat drops TRL < 0.20 on transformers 5"

# The optional-package flags trl.import_utils caches as `_<name>_available = _is_package_available(...)`
# in TRL 0.14.0 - 0.26.x (read from every version of that file; 0.14.0 has the first seven, 0.24 added
# math_verify and weave, 0.26 jmespath as `_is_jmespath_available`); 0.27 - 0.28 call the helper itself.
TRL_IMPORT_FLAGS = tuple(
    f"_{name}_available"
    for name in (
        "deepspeed",
        "diffusers",
        "llm_blender",
        "mergekit",
        "rich",
        "unsloth",
        "vllm",
        "fastapi",
        "joblib",
        "pydantic",
        "requests",
        "uvicorn",
        "vllm_ascend",
        "math_verify",
        "weave",
        "is_jmespath",
    )
)

# The modules of TRL 0.14.0 - 0.16.0.dev0 that bind unwrap_model_for_generation by name: zero3-unwrap
# rebinds each one it finds loaded to its wrapper.
UNWRAP_BINDINGS = (
    "unwrap_model_for_generation",
    *(
        f"{module}:unwrap_model_for_generation"
        for module in (
            "trl.models",
            "trl.trainer.callbacks",
            "trl.trainer.gkd_trainer",
            "trl.trainer.grpo_trainer",
            "trl.trainer.nash_md_trainer",
            "trl.trainer.online_dpo_trainer",
            "trl.trainer.ppo_trainer",
            "trl.trainer.rloo_trainer",
            "trl.trainer.xpo_trainer",
        )
    ),
)

# The modules of TRL 0.26.0 - 1.0.x that bind trl.data_utils.prepare_multimodal_messages by name (the trainer
# module's own binding first): vlm-tool-messages rebinds each one it finds loaded to its wrapper.
MULTIMODAL_MESSAGES_BINDINGS = (
    "prepare_multimodal_messages",
    *(
        f"{module}:prepare_multimodal_messages"
        for module in (
            "trl",
            "trl.data_utils",
            "trl.trainer.dpo_trainer",
            "trl.trainer.rloo_trainer",
            "trl.trainer.sft_trainer",
            "trl.experimental.dppo.dppo_trainer",
            "trl.experimental.gfpo.gfpo_trainer",
            "trl.experimental.grpo_with_replay_buffer.grpo_with_replay_buffer_trainer",
        )
    ),
)

# The method that tokenises the prompts and calls vLLM, which the three prompt patches wrap:
# compute_loss (0.14), _prepare_inputs (0.15), _generate_and_score_completions (0.16 - 0.23),
# _generate_single_turn (0.24.0.dev0 builds before PR #4152, vllm-double-bos's last window).
PROMPT_GENERATION = (
    "GRPOTrainer._generate_and_score_completions",
    "GRPOTrainer._prepare_inputs",
    "GRPOTrainer.compute_loss",
    "GRPOTrainer._generate_single_turn",
)

PATCHES = [
    # -- transformers 5 next to TRL < 0.20 ---------------------------------------------------------
    Patch(
        id="transformers5-import",
        summary=(
            "TRL < 0.29 on transformers >= 5.3: optional-package checks answer truthy tuples, so `from trl import GRPOTrainer` fails"
        ),
        symptom="`from trl import GRPOTrainer`: ModuleNotFoundError: No module named 'requests' (or vllm, weave, mergekit, ...)",
        upstream="https://github.com/huggingface/trl/pull/5129 (TRL 0.29.0 stops using transformers' _is_package_available)",
        fixed_in={"trl": "0.29.0"},
        trigger="trl.import_utils",
        must_exist="_is_package_available",
        changes=(*TRL_IMPORT_FLAGS, "_is_package_available"),
        # Its own window, not TRANSFORMERS5: every release up to 0.28.x imports transformers' helper (0.29.0.dev0
        # builds before PR #5129 too). transformers 5.0 - 5.2 still answer bools: the probe reads the answers.
        requires={"trl": affected("0.14.0", "0.29.0"), "transformers": affected("5.0.0")},
        witnesses={
            "trl": {
                "inside": ["0.14.0", "0.19.1", "0.20.0", "0.22.2", "0.26.1", "0.28.0", "0.29.0.dev0"],
                "outside": ["0.29.0", "1.0.0"],
            },
            "transformers": {"inside": ["5.0.0", "5.5.0", "5.23.0"], "outside": ["4.57.0"]},
        },
        remove_when="trl_compat no longer supports TRL < 0.29 on transformers >= 5.3",
    ),
    Patch(
        id="transformers5-use-cache",
        summary="TRL < 0.20 on transformers 5: GRPOTrainer(model=<path>) passes use_cache=None, which configs reject",
        symptom=(
            "StrictDataclassFieldValidationError: Validation error for field 'use_cache': "
            "TypeError: Field 'use_cache' expected bool, got NoneType (value: None)"
        ),
        upstream="none for TRL 0.14-0.19; TRL 0.20's model loading rewrite (PR #3072) no longer passes use_cache=None",
        fixed_in={"trl": "0.20.0"},
        must_exist="GRPOTrainer",  # the fix replaces the module's AutoModelForCausalLM; TRL's class must be there
        changes=("AutoModelForCausalLM",),
        requires=TRANSFORMERS5,
        # 0.20.0.dev0 builds carry 0.19's __init__ up to PR #3072 (56f4201db).
        witnesses={
            "trl": {"inside": ["0.14.0", "0.19.1", "0.20.0.dev0"], "outside": ["0.20.0"]},
            "transformers": {"inside": ["5.0.0"], "outside": ["4.57.0"]},
        },
        remove_when=TRANSFORMERS5_REMOVE_WHEN,
    ),
    Patch(
        id="transformers5-warnings-issued",
        summary="TRL < 0.27.2 on transformers >= 5.1: GRPOTrainer.__init__ sets model.warnings_issued, which is gone",
        symptom="AttributeError: 'Qwen2ForCausalLM' object has no attribute 'warnings_issued'",
        upstream="https://github.com/huggingface/trl/pull/4960 (fixed in 0.27.2)",
        fixed_in={"trl": "0.27.2"},
        must_exist="GRPOTrainer",  # the fix is on transformers' PreTrainedModel; TRL's class must be there
        changes=("transformers.modeling_utils:PreTrainedModel.warnings_issued",),
        # Its own window, not TRANSFORMERS5: the line lives on in TRL 0.20 - 0.27.1 (0.27.2 removed it), and
        # transformers 5.0.0 still creates the dict (5.1.0 dropped it; 5.0.0 and the 5.1.0.dev0 builds: the probe tells).
        requires={"trl": affected("0.14.0", "0.27.2"), "transformers": affected("5.1.0")},
        witnesses={
            "trl": {"inside": ["0.14.0", "0.19.1", "0.20.0", "0.27.1", "0.27.2.dev0"], "outside": ["0.27.2", "0.28.0"]},
            "transformers": {"inside": ["5.1.0", "5.23.0"], "outside": ["4.57.0", "5.0.0"]},
        },
        remove_when="trl_compat drops TRL < 0.27.2 on transformers >= 5.1",
    ),
    # -- PEFT, DeepSpeed ZeRO-3, the data loader, evaluation (TRL 0.14 - 0.18) --------------------
    Patch(
        id="peft-optional",
        summary="GRPO without peft installed: 'is this a PeftModel?' is no, and peft_config raises a clear ImportError early",
        symptom="NameError: name 'PeftModel' is not defined (or 'get_peft_model', with peft_config)",
        upstream=(
            "https://github.com/huggingface/trl/issues/2849 (PeftModel NameError from PR #2725, fixed by PR #2850/#2818 "
            "before 0.15.0); get_peft_model NameError fixed by PR #2848 in 0.16.0"
        ),
        fixed_in={"trl": "0.16.0"},
        must_exist="GRPOTrainer",  # the class: __init__ can never be missing (it is inherited)
        changes=("PeftModel", "PeftConfig", "get_peft_model", "GRPOTrainer.__init__"),
        # main reported 0.16.0.dev0 for five days before PR #2848 added the guard: the probe decides.
        requires={"trl": affected("0.14.0", "0.16.0")},
        witnesses={"trl": {"inside": ["0.14.0", "0.15.0.dev0", "0.15.2", "0.16.0.dev0"], "outside": ["0.16.0"]}},
        remove_when="trl_compat drops support for TRL < 0.16.0 (and 0.16.0.dev0 installs older than PR #2848)",
    ),
    Patch(
        id="zero3-unwrap",
        summary=(
            "under ZeRO-3, unwrapping the bare module uses its DeepSpeed engine: no AttributeError, hooks really "
            "removed during generation and restored (also on error)"
        ),
        symptom=(
            "AttributeError: 'Qwen2ForCausalLM' object has no attribute 'optimizer' (0.14.0; 0.15.x silently keeps the ZeRO-3 hooks)"
        ),
        upstream=(
            "https://github.com/huggingface/trl/issues/2782 (crash; guard in PR #2776, 0.15.0); "
            "hooks left in place fixed by PR #2871 in 0.16.0"
        ),
        fixed_in={"trl": "0.16.0"},
        trigger="trl.models.utils",
        must_exist="unwrap_model_for_generation",
        changes=UNWRAP_BINDINGS,
        requires={"trl": affected("0.14.0", "0.16.0"), "deepspeed": ">=0"},
        witnesses={"trl": {"inside": ["0.14.0", "0.15.0.dev0", "0.15.0", "0.15.2", "0.16.0.dev0"], "outside": ["0.16.0"]}},
        remove_when="trl_compat drops support for TRL < 0.16.0 (and 0.16.0.dev0 installs older than PR #2871)",
    ),
    Patch(
        id="zero3-hooks-api",
        summary="unwrapping a ZeRO-3 engine re-registers its hooks with the method the installed DeepSpeed has",
        symptom="AttributeError: 'DeepSpeedZeRoOffload' object has no attribute '_register_hooks_recursively'",
        upstream=(
            "https://github.com/deepspeedai/DeepSpeed/pull/6847 renamed _register_hooks_recursively "
            "(DeepSpeed 0.16.4); TRL handles both names from 0.16.0"
        ),
        fixed_in={"trl": "0.16.0"},
        trigger="trl.models.utils",
        must_exist="add_hooks",
        changes=("add_hooks",),
        # deepspeed: any installed one; the probe reads which method name it has.
        requires={"trl": affected("0.14.0", "0.16.0"), "deepspeed": ">=0"},
        witnesses={
            "trl": {"inside": ["0.14.0", "0.15.2", "0.16.0.dev0"], "outside": ["0.16.0"]},
            "deepspeed": {"inside": ["0.16.4"], "outside": []},
        },
        remove_when="trl_compat drops support for TRL < 0.16.0",
    ),
    Patch(
        id="logits-to-keep",
        summary="pass TRL's logits_to_keep/num_logits_to_keep under the name the model takes, else keep the last K logits",
        symptom=(
            "TypeError: forward() got an unexpected keyword argument 'logits_to_keep' "
            "(or RuntimeError: The size of tensor a (5) must match the size of tensor b (11))"
        ),
        upstream=(
            "https://github.com/huggingface/trl/issues/2770 (name mismatch; PR #2773 added a fallback slice in 0.15.0, "
            "PR #3553 removed it in 0.19.0); transformers PR #37149 removed num_logits_to_keep in 4.52"
        ),
        changes=("GRPOTrainer._get_per_token_logps", "GRPOTrainer._prepare_inputs"),
        # 0.20 renamed the entry point (_get_per_token_logps_and_entropies) and requires transformers>=4.53.2;
        # its 0.20.0.dev0 builds before PR #3563 carry 0.19's code: the probe tells them apart.
        requires={"trl": affected("0.14.0", "0.20.0")},
        witnesses={"trl": {"inside": ["0.14.0", "0.15.0", "0.18.2", "0.19.0", "0.19.1", "0.20.0.dev0"], "outside": ["0.20.0"]}},
        remove_when=(
            "trl_compat drops TRL < 0.20, or requires transformers >= 4.49 for TRL 0.15-0.18 and no longer supports "
            "TRL 0.14.0/0.19.x with models whose forward lacks logits_to_keep"
        ),
    ),
    Patch(
        id="train-sampler-signature",
        summary="GRPOTrainer._get_train_sampler accepts the dataset transformers >= 4.52 passes (train() no longer "
        "dies with TypeError); the grouped RepeatRandomSampler is unchanged",
        symptom="TypeError: GRPOTrainer._get_train_sampler() takes 1 positional argument but 2 were given",
        upstream=(
            "transformers PR #38090 (4.52: sampler_fn(dataset)) and #38226; "
            "fixed in TRL by PR #3283 (0.17.0, own get_train_dataloader) and PR #3488 (0.18.0, dataset argument)"
        ),
        fixed_in={"trl": "0.17.0"},
        must_exist="GRPOTrainer",  # the override it wraps is inherited from Trainer once removed: the class is what must exist
        changes=("GRPOTrainer._get_train_sampler", "GRPOTrainer._get_eval_sampler"),
        requires={"trl": affected("0.15.0", "0.17.0"), "transformers": affected("4.52.0")},
        witnesses={
            "trl": {"inside": ["0.15.0", "0.16.1", "0.17.0.dev0"], "outside": ["0.14.0", "0.17.0", "0.18.0"]},
            "transformers": {"inside": ["4.52.0"], "outside": ["4.51.3"]},
        },
        remove_when="trl_compat no longer supports TRL < 0.17.0 (and 0.17.0.dev0 installs older than PR #3283)",
    ),
    Patch(
        id="dataloader-workers",
        summary="dataloader_num_workers >= 1: seed_worker gets num_workers and rank (TRL 0.17-0.18.1 x "
        "transformers >= 4.52) and the collator pickles for spawn workers",
        symptom=(
            "TypeError: seed_worker() missing 2 required positional arguments: 'num_workers' and 'rank' "
            "(spawn workers: Can't pickle local object 'GRPOTrainer.__init__.<locals>.data_collator')"
        ),
        upstream="https://github.com/huggingface/trl/pull/3568 (issues #3544, #2979, #3567; fixed in 0.18.2)",
        fixed_in={"trl": "0.18.2"},
        changes=("GRPOTrainer.get_train_dataloader", "GRPOTrainer.__init__"),
        # Up to 0.19.0: 0.18.2 holds the fix (the probe finds it), 0.19.0.dev0 builds may not.
        requires={"trl": affected("0.14.0", "0.19.0")},
        witnesses={"trl": {"inside": ["0.14.0", "0.17.0", "0.18.1", "0.18.2", "0.19.0.dev0"], "outside": ["0.19.0"]}},
        remove_when="trl_compat no longer supports TRL < 0.18.2",
    ),
    Patch(
        id="grpo-eval-0.14",
        summary="GRPO evaluation on TRL 0.14.0: prediction_step computes the GRPO loss (no AttributeError); "
        "eval_loss, eval_reward, ... logged apart from the training metrics",
        symptom="AttributeError: 'list' object has no attribute 'get'",
        upstream="https://github.com/huggingface/trl/pull/2694 (fixed in 0.15.0; metrics split by mode in 0.16.0)",
        fixed_in={"trl": "0.15.0"},
        must_exist="GRPOTrainer",  # log and prediction_step fall back to Trainer's: the class is what must exist
        changes=("GRPOTrainer.prediction_step", "GRPOTrainer.log"),
        requires={"trl": affected("0.14.0", "0.15.0")},
        witnesses={"trl": {"inside": ["0.14.0", "0.15.0.dev0"], "outside": ["0.15.0", "0.16.0"]}},
        remove_when="trl_compat no longer supports TRL 0.14.x (and 0.15.0.dev0 installs older than PR #2694)",
    ),
    # -- vLLM weight sync (TRL 0.14 - 0.15) --------------------------------------------------------
    Patch(
        id="vllm-lora-names",
        summary="LoRA + use_vllm: PEFT names and unmerged weights went to vLLM ('no module or parameter "
        "named base_model'); send base names and merged weights instead",
        symptom="ValueError: There is no module or parameter named 'base_model' in Qwen2ForCausalLM",
        upstream="https://github.com/huggingface/trl/issues/2698 (fixed by PR #2725 in 0.15.0; merged values in 0.15.1)",
        fixed_in={"trl": "0.15.0"},
        changes=("GRPOTrainer._move_model_to_vllm", "GRPOTrainer.compute_loss", "GRPOTrainer._prepare_inputs"),
        requires={"trl": affected("0.14.0", "0.15.0"), "vllm": ">=0"},
        witnesses={"trl": {"inside": ["0.14.0", "0.15.0.dev0"], "outside": ["0.15.0", "0.15.1"]}},
        remove_when="TRL < 0.15.0 is no longer supported",
    ),
    Patch(
        id="vllm-merged-weights",
        summary="LoRA + use_vllm: vLLM got the base weights (unmerge ran before load_weights); "
        "send merged weights computed out of place instead",
        symptom="silent: vLLM generates from the base model, not the LoRA-merged one; the reward curve stays flat",
        upstream="https://github.com/huggingface/trl/issues/2856 (fixed by PR #2873 in 0.15.1)",
        fixed_in={"trl": "0.15.1"},
        must_exist="GRPOTrainer._move_model_to_vllm",
        changes=("GRPOTrainer._move_model_to_vllm",),
        requires={"trl": affected("0.15.0", "0.16.0"), "vllm": ">=0"},
        # The fix was released in 0.15.1 (where the probe finds it) and landed on main as 0.16.0.dev0.
        witnesses={"trl": {"inside": ["0.15.0", "0.15.0.dev0", "0.15.1", "0.15.2", "0.16.0.dev0"], "outside": ["0.14.0", "0.16.0"]}},
        remove_when="TRL < 0.15.1 is no longer supported",
    ),
    # after vllm-merged-weights: it wraps the same method
    Patch(
        id="vllm-prefix-cache",
        summary="use_vllm: vLLM's prefix cache kept KV from older weights after each sync; reset it",
        symptom="silent: completions sampled with KV cached under older weights (off-policy), no error",
        upstream="https://github.com/huggingface/trl/issues/3024 (fixed in 0.16.0)",
        fixed_in={"trl": "0.16.0"},
        must_exist="GRPOTrainer._move_model_to_vllm",
        changes=("GRPOTrainer._move_model_to_vllm",),
        requires={"trl": affected("0.15.0", "0.16.0"), "vllm": ">=0"},
        witnesses={"trl": {"inside": ["0.15.0", "0.15.1", "0.15.2", "0.16.0.dev0"], "outside": ["0.14.0", "0.16.0"]}},
        remove_when="TRL 0.15.x is no longer supported",
    ),
    # -- log-probs (TRL 0.14 - 0.15) ---------------------------------------------------------------
    # 0.14.0: logps-attention-mask and logps-temperature wrap compute_loss (as does vllm-lora-names),
    # each scoping hooks to TRL's log-prob calls; on 0.15, logps-temperature wraps _get_per_token_logps
    # above logits-to-keep
    Patch(
        id="logps-attention-mask",
        summary="pass the attention mask to TRL 0.14.0's policy and reference log-prob forwards",
        symptom="silent: left-padding attended to in the policy and reference log-probs and the KL",
        upstream="https://github.com/huggingface/trl/pull/2708 (fixed in 0.15.0)",
        fixed_in={"trl": "0.15.0"},
        must_exist="GRPOTrainer",  # compute_loss is inherited from Trainer once removed: the class is what must exist
        changes=("GRPOTrainer.compute_loss",),
        requires={"trl": affected("0.14.0", "0.15.0")},
        witnesses={"trl": {"inside": ["0.14.0", "0.15.0.dev0"], "outside": ["0.15.0"]}},
        remove_when="TRL 0.14.0 is no longer supported",
    ),
    Patch(
        id="logps-temperature",
        summary="opt-in (TRL_COMPAT_LOGPS_TEMPERATURE=1): compute GRPO log-probs at the sampling temperature, as TRL 0.16 does",
        symptom="silent: log-probs computed at temperature 1 for completions sampled at GRPOConfig.temperature",
        upstream="https://github.com/huggingface/trl/pull/3029 (fixed in 0.16.0)",
        fixed_in={"trl": "0.16.0"},
        changes=("GRPOTrainer._get_per_token_logps", "GRPOTrainer._get_per_token_logps_and_entropies", "GRPOTrainer.compute_loss"),
        requires={"trl": affected("0.14.0", "0.16.0")},
        witnesses={"trl": {"inside": ["0.14.0", "0.15.2", "0.16.0.dev0"], "outside": ["0.16.0"]}},
        opt_in="TRL_COMPAT_LOGPS_TEMPERATURE",
        remove_when="TRL 0.15.x is no longer supported",
    ),
    # -- trainer set-up, resuming, reward models (TRL 0.14 - 0.16) ---------------------------------
    # pad-token wraps __init__ to set the pad token before TRL reads it; peft-gradient-checkpointing
    # wraps it too, to act after it
    Patch(
        id="pad-token",
        summary="tokenizer without a pad token: use its EOS token as pad token, as TRL 0.17 does",
        symptom="ValueError: Asking to pad but the tokenizer does not have a padding token",
        upstream="https://github.com/huggingface/trl/issues/3287 (fixed by PR #3290 in 0.17.0)",
        fixed_in={"trl": "0.17.0"},
        changes=("GRPOTrainer.__init__",),
        requires={"trl": affected("0.14.0", "0.17.0")},
        witnesses={"trl": {"inside": ["0.14.0", "0.16.1", "0.17.0.dev0"], "outside": ["0.17.0"]}},
        remove_when="TRL 0.16.x is no longer supported",
    ),
    Patch(
        id="peft-gradient-checkpointing",
        summary="LoRA + reentrant gradient checkpointing: make the embedding output require grad, as TRL 0.16 does",
        symptom="RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn",
        upstream="https://github.com/huggingface/trl/issues/2671 (fixed by PR #2848 in 0.16.0)",
        fixed_in={"trl": "0.16.0"},
        changes=("GRPOTrainer.__init__",),
        requires={"trl": affected("0.14.0", "0.16.0"), "peft": ">=0.0.dev0"},
        witnesses={"trl": {"inside": ["0.14.0", "0.15.2", "0.16.0.dev0"], "outside": ["0.16.0"]}},
        remove_when="TRL 0.15.x is no longer supported",
    ),
    Patch(
        id="resume-buffered-inputs",
        summary="resume_from_checkpoint with num_iterations > 1: the first resumed steps got None inputs "
        "(TypeError); generate when the buffer is empty, as TRL 0.17.0 does",
        symptom="TypeError: 'NoneType' object is not subscriptable",
        upstream="https://github.com/huggingface/trl/pull/3148 (fixed in 0.17.0)",
        fixed_in={"trl": "0.17.0"},
        must_exist="GRPOTrainer",  # _prepare_inputs is inherited from transformers' Trainer where TRL has none
        changes=("GRPOTrainer._prepare_inputs",),
        requires={"trl": affected("0.16.0", "0.17.0")},
        witnesses={"trl": {"inside": ["0.16.0", "0.16.1", "0.17.0.dev0"], "outside": ["0.15.2", "0.17.0"]}},
        remove_when="trl_compat no longer supports TRL 0.16.x",
    ),
    Patch(
        id="reward-model-zero3",
        summary="DeepSpeed ZeRO-3: a model given as reward function was left partitioned and its first forward "
        "failed (Padding_idx must be within num_embeddings); prepare it with prepare_deepspeed",
        symptom="AssertionError: Padding_idx must be within num_embeddings",
        upstream="https://github.com/huggingface/trl/issues/3202 (fixed by PR #3326 in 0.17.0)",
        fixed_in={"trl": "0.17.0"},
        changes=("GRPOTrainer.__init__",),
        requires={"trl": affected("0.14.0", "0.17.0"), "deepspeed": ">=0"},
        witnesses={"trl": {"inside": ["0.14.0", "0.16.1", "0.17.0.dev0"], "outside": ["0.17.0"]}},
        remove_when="trl_compat no longer supports TRL < 0.17.0",
    ),
    # -- vLLM prompts (TRL 0.14 - 0.23) ------------------------------------------------------------
    # the three prompt patches wrap the same generation method; each corrects only its own part of
    # vLLM's prompt
    Patch(
        id="vllm-prompt-truncation",
        summary="use_vllm: vLLM generated from the untruncated prompt, the loss saw its last max_prompt_length ids",
        symptom=(
            "silent: vLLM samples from the untruncated prompt (too long for vLLM: ValueError: The decoder "
            "prompt (length ...) is longer than the maximum model length of ...)"
        ),
        upstream="https://github.com/huggingface/trl/issues/3569 (fixed in 0.19.0 by PR #3601)",
        fixed_in={"trl": "0.19.0"},
        changes=PROMPT_GENERATION,
        requires={"trl": affected("0.14.0", "0.19.0"), "vllm": ">=0"},
        witnesses={"trl": {"inside": ["0.14.0", "0.18.2", "0.19.0.dev0"], "outside": ["0.19.0"]}},
        remove_when="TRL < 0.19 is no longer supported",
    ),
    Patch(
        id="vllm-prompt-special-tokens",
        summary="use_vllm: TRL 0.19.0 stripped chat-template tokens and BOS from every vLLM prompt",
        symptom="silent: every vLLM prompt loses its chat-template tokens and BOS; mangled completions",
        upstream="https://github.com/huggingface/trl/issues/3644 (fixed in 0.19.1 by PRs #3651, #3698)",
        fixed_in={"trl": "0.19.1"},
        changes=PROMPT_GENERATION,
        requires={"trl": affected("0.19.0", "0.20.0"), "vllm": ">=0"},
        witnesses={"trl": {"inside": ["0.19.0", "0.19.1", "0.20.0.dev0"], "outside": ["0.18.2", "0.20.0"]}},
        remove_when="TRL 0.19.0 is no longer supported",
    ),
    Patch(
        id="vllm-double-bos",
        summary="use_vllm: vLLM added a second BOS (the tokenizer's) to chat-templated prompts training tokenised with one",
        symptom="silent: vLLM generates after two BOS tokens where training has one; lower reward with vLLM",
        upstream="https://github.com/huggingface/trl/issues/3853 (fixed in 0.24.0 by PR #4152)",
        fixed_in={"trl": "0.24.0"},
        changes=PROMPT_GENERATION,
        requires={"trl": affected("0.14.0", "0.24.0"), "vllm": ">=0"},
        witnesses={"trl": {"inside": ["0.14.0", "0.19.1", "0.20.0", "0.23.1", "0.24.0.dev0"], "outside": ["0.24.0"]}},
        remove_when="TRL < 0.24 is no longer supported",
    ),
    # -- vLLM engine and weight sync (TRL 0.16+) ---------------------------------------------------
    Patch(
        id="vllm-v1-engine",
        summary="use_vllm on vLLM >= 0.8: V1 engine has no llm_engine.model_executor; default VLLM_USE_V1=0",
        symptom="AttributeError: 'LLMEngine' object has no attribute 'model_executor'",
        upstream="https://github.com/huggingface/trl/issues/3115 (never fixed in-process; server mode in 0.16.0)",
        fixed_in={},
        changes=("GRPOTrainer.__init__",),
        requires={"trl": affected("0.14.0", "0.16.0"), "vllm": affected("0.8.0")},
        witnesses={
            "trl": {"inside": ["0.14.0", "0.15.2", "0.16.0.dev0"], "outside": ["0.16.0"]},
            "vllm": {"inside": ["0.8.0", "0.8.5.post2", "0.10.2"], "outside": ["0.7.2"]},
        },
        remove_when=(
            "TRL 0.14.x and 0.15.x are no longer supported (or vLLM < 0.11, the last releases with the V0 engine the patch selects)"
        ),
    ),
    Patch(
        id="fsdp2-vllm-sync",
        summary="use_vllm + FSDP2: send the full FSDP2 weights (0.18/0.19: none reached vLLM), under the base "
        "model's names with LoRA merged (0.20 - 0.25 sent PEFT's names)",
        symptom=(
            "silent: under FSDP2 vLLM generates from the initial weights for the whole run (0.18/0.19); "
            "ValueError: There is no module or parameter named 'base_model' (LoRA, 0.20 - 0.25)"
        ),
        upstream="https://github.com/huggingface/trl/pull/3687 (fixed in 0.20.0; reported in PR #3670); "
        "LoRA names: PR #4603 (fixed in 0.26.0)",
        fixed_in={"trl": "0.20.0"},
        changes=("GRPOTrainer._sync_fsdp_params_to_vllm", "GRPOTrainer._sync_fsdp2_params_to_vllm"),
        requires={"trl": affected("0.18.0", "0.26.0"), "vllm": ">=0"},
        witnesses={
            "trl": {"inside": ["0.18.0", "0.19.1", "0.20.0", "0.24.0", "0.25.1", "0.26.0.dev0"], "outside": ["0.17.0", "0.26.0"]}
        },
        remove_when="TRL < 0.26 is no longer supported",
    ),
    # Open upstream: no release has fixed these two, so their windows stay open and the probes watch for the fix.
    # fsdp2-ignored-params-sync wraps the FSDP2 sync above fsdp2-vllm-sync (0.20 - 0.25): it only changes
    # what the module it is handed returns, which the other's own sync reads the same way
    Patch(
        id="fsdp2-ignored-params-sync",
        summary="use_vllm + FSDP2 with ignored_params: send the ignored (plain) parameters as they are, gather only DTensors",
        symptom="AttributeError: 'Tensor' object has no attribute 'full_tensor' (at the first weight sync)",
        upstream="https://github.com/huggingface/trl/issues/6622 (open; PR #6623 open): not fixed upstream",
        fixed_in={},
        changes=(
            "GRPOTrainer._sync_fsdp2_params_to_vllm",
            "trl.generation.vllm_generation:VLLMGeneration._sync_fsdp2_params_to_vllm",
            "trl.generation.vllm_generation:VLLMGeneration._iter_fsdp2_params",
        ),
        # brought by PR #3687 (5522cc0a3, 0.20.0), the first FSDP2 sync
        requires={"trl": affected("0.20.0"), "vllm": ">=0"},
        witnesses={"trl": {"inside": ["0.20.0.dev0", "0.20.0", "0.26.0", "0.29.1", "1.9.2", "1.16.0"], "outside": ["0.19.1"]}},
        remove_when=(
            "a TRL release gathers only the DTensors in its FSDP2 weight sync (issue #6622) and older releases are no longer supported"
        ),
    ),
    Patch(
        id="vllm-packed-lora-sync",
        summary="server mode + LoRA: stream copies of the merged weights, so vLLM's packed producer reads them before the unmerge",
        symptom="silent: the vLLM server generates from the base weights of every LoRA-targeted layer (a model under 1 GiB)",
        upstream="no upstream issue (TRL PR #6765's packed sync, 1.11.0): not fixed upstream",
        fixed_in={},
        changes=("trl.generation.vllm_generation:VLLMGeneration._iter_named_params",),
        # PR #6765 (1.11.0) streams the walk to vLLM's packed producer; 1.12.0 ships the same GRPO files
        requires={"trl": affected("1.11.0"), "vllm": ">=0", "peft": ">=0.0.dev0"},
        witnesses={"trl": {"inside": ["1.11.0.dev0", "1.11.0", "1.12.0", "1.16.0"], "outside": ["1.10.0"]}},
        remove_when="a TRL release streams copies of the merged LoRA weights to the server and older releases are no longer supported",
    ),
    # vllm-lora-merge-drift wraps the walk above vllm-packed-lora-sync: where it merges out of place it
    # yields fresh tensors in server mode and does not call the walk below (whose copies it makes
    # unneeded); under ZeRO-3, FSDP or an unknown model structure it calls it, copies and all
    Patch(
        id="vllm-lora-merge-drift",
        summary="LoRA + use_vllm: send vLLM merged weights computed out of place instead of merging the adapter "
        "into the live weights and unmerging it (TRL >= 1.11's walk)",
        symptom="silent: the frozen bf16/fp16 base weights drift by rounding at every weight sync, accumulating over the run",
        upstream="https://github.com/huggingface/trl/issues/6688 (open): not fixed upstream",
        fixed_in={},
        changes=("trl.generation.vllm_generation:VLLMGeneration._iter_named_params",),
        # the in-place merge dates from 0.15.0 (vllm-merged-weights replaces 0.15.0's walk); the walk this
        # patch covers is PR #6765's (1.11.0): 0.15.1 - 1.10 are not patched (ledger record open:6688)
        requires={"trl": affected("1.11.0"), "vllm": ">=0", "peft": ">=0.0.dev0"},
        witnesses={"trl": {"inside": ["1.11.0.dev0", "1.11.0", "1.12.0", "1.16.0"], "outside": ["1.10.0", "1.9.2", "0.29.1"]}},
        remove_when=(
            "a TRL release no longer merges the LoRA adapter into the live weights for the vLLM sync (issue #6688) "
            "and older releases are no longer supported"
        ),
    ),
    # vllm-sleep-mode-weights wraps __init__ only to register the engine after TRL built it
    # (tools-empty-list-template, registered later, stacks above: each acts after TRL's __init__ on
    # attributes the other never reads), and vLLM's LLM methods, which no other patch changes
    Patch(
        id="vllm-sleep-mode-weights",
        summary="colocate + vllm_enable_sleep_mode: sync after every level-2 sleep and keep TRL's reload from disk "
        "from overwriting the synced weights",
        symptom=(
            "silent: vLLM samples from the initial checkpoint (0.26+: eval / unchanged steps; 0.28+: always, "
            "importance-sampling ratio ~1e-7) or from garbage weights (0.25)"
        ),
        upstream="https://github.com/huggingface/trl/issues/5312 (fixed in 1.10.0 by PR #5313; vllm#29341)",
        fixed_in={"trl": "1.10.0"},
        must_exist="GRPOTrainer._generate_single_turn",
        changes=(
            "GRPOTrainer.__init__",
            "GRPOTrainer._move_model_to_vllm",
            "trl.generation.vllm_generation:VLLMGeneration.sync_weights",
            "vllm.entrypoints.llm:LLM.sleep",
            "vllm.entrypoints.llm:LLM.wake_up",
            "vllm.entrypoints.llm:LLM.collective_rpc",
        ),
        # PR #5313 reached the 1.10.0 release; main builds before and after it are 1.10.0.dev0: the probe decides
        requires={"trl": affected("0.25.0", "1.10.0"), "vllm": ">=0"},
        witnesses={
            "trl": {
                "inside": ["0.25.0", "0.26.0", "0.28.0", "0.29.1", "1.0.0", "1.9.2", "1.10.0.dev0"],
                "outside": ["0.24.0", "0.23.1", "1.10.0", "1.16.0"],
            }
        },
        remove_when="trl_compat no longer supports TRL < 1.10 (0.25.0 - 1.9.2: no earlier release fixes it)",
    ),
    Patch(
        id="tools-colocate-llm-attr",
        summary="tools + vllm_mode='colocate': give GRPOTrainer the read-only llm attribute its tool loop reads "
        "(the engine moved to vllm_generation.llm)",
        symptom="AttributeError: 'GRPOTrainer' object has no attribute 'llm'",
        upstream="https://github.com/huggingface/trl/issues/5301 (fixed by PR #5302 in 0.29.1)",
        fixed_in={"trl": "0.29.1"},
        must_exist="GRPOTrainer._tool_call_loop",
        changes=("GRPOTrainer.llm",),
        # TRL 0.28 / 0.29.0 refuse tools on transformers < 5 (ImportError): the loop is reached on 5+ only
        requires={"trl": affected("0.28.0", "0.29.1"), "transformers": affected("5.0.0"), "vllm": ">=0"},
        witnesses={
            "trl": {"inside": ["0.28.0", "0.29.0", "0.29.1.dev0"], "outside": ["0.27.2", "0.29.1"]},
            "transformers": {"inside": ["5.0.0", "5.2.0"], "outside": ["4.57.6"]},
        },
        remove_when="TRL 0.28.x and 0.29.0 are no longer supported",
    ),
    # -- vLLM's raw log-probs in TRL's importance-sampling correction (TRL 0.23+) ------------------
    # Two ids for one bug: the registry takes one trigger module per patch, and the server half runs
    # in the `trl vllm-serve` process (trl.scripts.vllm_serve), not the trainer's. Both replace only
    # their module's `LLM` global, which no other patch changes.
    Patch(
        id="vllm-is-raw-logprobs",
        summary="use_vllm colocate: vLLM's raw (temperature 1) log-probs fed the IS ratio; build the engine with processed ones",
        symptom="silent: importance-sampling ratio far from 1 (at the cap at low temperature); token losses reweighted wrongly",
        upstream="https://github.com/huggingface/trl/issues/4159 (fixed for colocate in 0.24.0 by PR #4163)",
        fixed_in={"trl": "0.24.0"},
        changes=("LLM",),
        requires={"trl": affected("0.23.0", "0.24.0"), "vllm": affected("0.10.0")},
        witnesses={
            "trl": {"inside": ["0.23.0", "0.23.1", "0.24.0.dev0"], "outside": ["0.22.2", "0.24.0"]},
            "vllm": {"inside": ["0.10.0", "0.10.2"], "outside": ["0.9.1"]},
        },
        remove_when="TRL 0.23.x is no longer supported",
    ),
    # Open upstream: no release has fixed it, so the window stays open and the probe watches for the fix.
    Patch(
        id="vllm-is-truncated-support",
        summary="use_vllm with top_k/top_p/min_p: replay vLLM's truncation on the trainer's log-probs for the IS ratio",
        symptom="silent: every IS ratio scaled by the kept mass (top_k=20: ~0.1); sequence_mask drops long completions",
        upstream="https://github.com/huggingface/trl/issues/6789 (open; PR #7269 closed unmerged, PR #6880 a warning)",
        fixed_in={},
        must_exist="GRPOTrainer._get_per_token_logps_and_entropies",
        changes=("GRPOTrainer._generate_and_score_completions", "GRPOTrainer._get_per_token_logps_and_entropies"),
        # introduced by PR #4163 (e086f073c, 0.24.0.dev0): processed_logprobs are those of the truncated distribution
        # vLLM 0.10.2 is the first whose processed log-probs are taken after the temperature and top-k/top-p
        requires={"trl": affected("0.24.0"), "vllm": affected("0.10.2")},
        witnesses={
            "trl": {"inside": ["0.24.0.dev0", "0.24.0", "0.29.1", "1.0.0", "1.16.0"], "outside": ["0.23.1"]},
            "vllm": {"inside": ["0.10.2", "0.31.0"], "outside": ["0.10.1.1"]},
        },
        remove_when=(
            "a TRL release replays the sampling truncation for the importance-sampling ratio (issue #6789) and "
            "older releases are no longer supported"
        ),
    ),
    Patch(
        id="vllm-serve-raw-logprobs",
        summary="trl vllm-serve: the server's vLLM returned raw (temperature 1) log-probs to the IS ratio; use processed ones",
        symptom="silent: importance-sampling ratio far from 1 in server mode; with sequence_mask most sequences dropped (#4772)",
        upstream="https://github.com/huggingface/trl/pull/4873 (fixed in 0.27.1; server half of TRL issue #4159)",
        fixed_in={"trl": "0.27.1"},
        trigger="trl.scripts.vllm_serve",
        must_exist="llm_worker",
        changes=("LLM",),
        requires={"trl": affected("0.23.0", "0.27.1"), "vllm": affected("0.10.0")},
        witnesses={
            "trl": {"inside": ["0.23.0", "0.24.0", "0.27.0", "0.27.1.dev0"], "outside": ["0.22.2", "0.27.1"]},
            "vllm": {"inside": ["0.10.0", "0.12.0"], "outside": ["0.9.1"]},
        },
        remove_when="TRL < 0.27.1 is no longer supported",
    ),
    # -- imports: TRL 0.16 - 0.27 next to newer vLLM releases; TRL 0.26.0's server-mode chat -------
    Patch(
        id="vllm-guided-decoding-import",
        summary="vLLM >= 0.12: GuidedDecodingParams put back (built as StructuredOutputsParams); TRL's guided_decoding= "
        "passed to SamplingParams as structured_outputs=",
        symptom="`from trl import GRPOTrainer` (or `trl vllm-serve`): ImportError: cannot import name 'GuidedDecodingParams' "
        "from 'vllm.sampling_params'",
        upstream="https://github.com/huggingface/trl/issues/4617 (vLLM PR #29326 removed the name; fixed by TRL PR #4117 in 0.27.0)",
        fixed_in={"trl": "0.27.0"},
        # The package: it is imported before the TRL modules that import the name, whose own import
        # would be too late a trigger (see the patch's docstring).
        trigger="trl",
        # the package's source location: the probe reads the source files of TRL's modules (what the
        # patch changes lives in vLLM's and TRL's modules; __version__ is one of the lazy module's objects)
        must_exist="__file__",
        changes=(
            "vllm.sampling_params:GuidedDecodingParams",
            "trl.trainer.grpo_trainer:SamplingParams",
            "trl.scripts.vllm_serve:SamplingParams",
        ),
        # trl: vllm-serve from 0.16.0, the GRPO trainer from 0.18.0 (the probe reads which).
        requires={"trl": affected("0.16.0", "0.27.0"), "vllm": affected("0.12.0")},
        witnesses={
            "trl": {"inside": ["0.16.0", "0.18.0", "0.26.2", "0.27.0.dev0"], "outside": ["0.15.2", "0.27.0"]},
            "vllm": {"inside": ["0.12.0", "0.14.0"], "outside": ["0.11.2"]},
        },
        remove_when="trl_compat no longer supports TRL < 0.27.0",
    ),
    Patch(
        id="vllm-serve-get-open-port",
        summary="vLLM >= 0.14: vllm.utils.get_open_port re-exported from vllm.utils.network_utils, so `trl vllm-serve` starts",
        symptom="`trl vllm-serve`: ImportError: cannot import name 'get_open_port' from 'vllm.utils'",
        upstream="https://github.com/huggingface/trl/pull/4883 (fixed in 0.28.0)",
        fixed_in={"trl": "0.28.0"},
        trigger="vllm.utils",
        must_exist="__name__",  # the module itself: what the patch adds is the name it lacks
        changes=("get_open_port",),
        requires={"trl": affected("0.17.0", "0.28.0"), "vllm": affected("0.14.0")},
        witnesses={
            "trl": {"inside": ["0.17.0", "0.26.2", "0.27.2", "0.28.0.dev0"], "outside": ["0.16.0", "0.28.0"]},
            "vllm": {"inside": ["0.14.0"], "outside": ["0.13.0", "0.12.0"]},
        },
        remove_when="trl_compat no longer supports TRL < 0.28.0",
    ),
    Patch(
        id="tools-empty-list-server",
        summary="TRL 0.26.0 and 0.28.0 server mode: tools=[] reaches VLLMClient.chat as None, so chat prompts without tools generate",
        symptom="NotImplementedError: Tool calling is not yet implemented in VLLMClient.chat().",
        upstream=(
            "https://github.com/huggingface/trl/pull/4663 (fixed in 0.26.1); back in 0.28.0 (generation moved to "
            "trl/generation/), fixed in 0.29.0 (VLLMClient.chat takes tools)"
        ),
        # up to 0.27 the trainer binds VLLMClient from trl.extras.vllm_client; 0.28's VLLMGeneration builds
        # trl.generation.vllm_client's: the chat of the one in use is wrapped
        fixed_in={"trl": "0.29.0"},  # 0.26.1 too; 0.28.0 brought it back
        changes=("trl.extras.vllm_client:VLLMClient.chat", "trl.generation.vllm_client:VLLMClient.chat"),
        # use_vllm=True needs vLLM installed; the fix reached 0.26.1 as a cherry-pick and main as
        # 0.27.0.dev0 (26f989efa), and 0.27.x keep it: the probe tells them apart from 0.26.0 and 0.28.0
        requires={"trl": affected("0.26.0", "0.29.0"), "vllm": ">=0"},
        witnesses={
            "trl": {"inside": ["0.26.0", "0.26.1", "0.27.0.dev0", "0.27.2", "0.28.0", "0.29.0.dev0"], "outside": ["0.25.1", "0.29.0"]}
        },
        remove_when="trl_compat no longer supports TRL 0.26.0 and 0.28.x",
    ),
    # -- tools: the chat template of a run without tools (0.26.0, 0.28.0 - 0.29.1) and the tool turn's
    # suffix ids (0.29.1). tools-empty-list-template wraps __init__ only to reset an empty tools
    # list after TRL's own __init__; tool-suffix-eos-newline wraps a method no other patch changes.
    Patch(
        id="tools-empty-list-template",
        summary="no tools: pass tools=None, not [], to the chat template (GRPOTrainer.tools and VLLMGeneration.tools)",
        symptom=(
            "silent: Llama-3.x-style templates (`tools is not none`) render tool-calling boilerplate "
            '("Environment: ipython", function-calling instructions) into every prompt of a run without tools'
        ),
        upstream="https://github.com/huggingface/trl/issues/5379 (fixed in 1.0.0 by PR #5380)",
        changes=("GRPOTrainer.__init__",),
        # 0.26.1 - 0.27.2 keep None (PR #4663) and main was 1.0.0.dev0 from 0.29.0 to the fix
        # (4890abf0a): the probe tells them apart
        requires={"trl": affected("0.26.0", "1.0.0")},
        witnesses={"trl": {"inside": ["0.26.0", "0.26.1", "0.28.0", "0.29.1", "1.0.0.dev0"], "outside": ["0.25.1", "1.0.0"]}},
        fixed_in={"trl": "1.0.0"},
        remove_when="trl_compat no longer supports TRL 0.26.0 and 0.28.0 - 0.29.1",
    ),
    Patch(
        id="colocate-generation-kwargs",
        summary="TRL 0.19.0 colocated vLLM: generation_kwargs=None (the default) becomes {}, as TRL 0.19.1 reads it",
        symptom="TypeError: 'NoneType' object is not iterable (generation_kwargs.update(None), first step, vllm_mode='colocate')",
        upstream="https://github.com/huggingface/trl/pull/3634 (fixed in 0.19.1)",
        changes=("GRPOTrainer.__init__",),
        # generation_kwargs arrived in 0.19.0; 84982ad79 (0.19.1.dev0 on main, cherry-picked as 34fa6b9af) fixed it
        requires={"trl": affected("0.19.0", "0.19.1")},
        witnesses={"trl": {"inside": ["0.19.0", "0.19.1.dev0"], "outside": ["0.18.2", "0.19.1"]}},
        fixed_in={"trl": "0.19.1"},
        remove_when="trl_compat no longer supports TRL 0.19.0",
    ),
    Patch(
        id="colocate-master-port",
        summary="colocated vLLM: an unset MASTER_PORT becomes a free port, not 12345, as TRL 0.24 chooses it",
        symptom=(
            "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. "
            "port: 12345 (EADDRINUSE: a second colocated run on the host)"
        ),
        upstream="https://github.com/huggingface/trl/pull/4057 (fixed in 0.24.0)",
        changes=("GRPOTrainer.__init__",),
        # the 12345 fallback arrived with PR #3723 (640a9f391, 0.20.0); 008c7ad9a (0.24.0.dev0) fixed it, read by the probe
        requires={"trl": affected("0.20.0", "0.24.0")},
        witnesses={"trl": {"inside": ["0.20.0", "0.22.1", "0.23.1", "0.24.0.dev0"], "outside": ["0.19.1", "0.24.0"]}},
        fixed_in={"trl": "0.24.0"},
        remove_when="trl_compat no longer supports TRL 0.20 - 0.23",
    ),
    Patch(
        id="tool-iterations-zero",
        summary="max_tool_calling_iterations=0 means no tool-calling turn, as TRL 1.9 reads it",
        symptom="silent: max_tool_calling_iterations=0 runs the tool loop without limit (turn after turn) instead of none",
        upstream="https://github.com/huggingface/trl/pull/6423 (fixed in 1.9.0)",
        changes=("GRPOTrainer.__init__",),
        # the setting arrived in 0.27.0 read as `or sys.maxsize`; c24964d0a (1.9.0.dev0) fixed it, read by the probe
        requires={"trl": affected("0.27.0", "1.9.0")},
        witnesses={"trl": {"inside": ["0.27.0", "0.29.1", "1.0.0", "1.8.0", "1.9.0.dev0"], "outside": ["0.26.2", "1.9.0"]}},
        fixed_in={"trl": "1.9.0"},
        remove_when="trl_compat no longer supports TRL < 1.9.0",
    ),
    Patch(
        id="tool-suffix-eos-newline",
        summary="tools + Qwen3-style templates: keep what the template writes after EOS (<|im_end|>\\n) in the ids "
        "between a completion and its tool result",
        symptom="silent: with Qwen3 / Qwen3.5 templates the newline after <|im_end|> is missing before every tool result",
        upstream="https://github.com/huggingface/trl/issues/5317 (fixed in 1.0.0 by PR #5330)",
        changes=("GRPOTrainer._get_tool_suffix_ids",),
        # TRL 0.29.1 refuses tools on transformers < 5 (ImportError). The bug came with #5242 (0.29.1,
        # main 1.0.0.dev0 ebdfe826f) and left with #5330 (5bb083cf8, main 1.0.0.dev0): the probe decides
        requires={"trl": affected("0.29.1", "1.0.0"), "transformers": affected("5.0.0")},
        witnesses={
            "trl": {"inside": ["0.29.1", "1.0.0.dev0"], "outside": ["0.29.0", "1.0.0"]},
            "transformers": {"inside": ["5.0.0", "5.2.0"], "outside": ["4.57.6"]},
        },
        fixed_in={"trl": "1.0.0"},
        remove_when="trl_compat no longer supports TRL 0.29.1",
    ),
    # wraps the module-level name GRPOTrainer.__init__ calls, which no other entry declares
    Patch(
        id="tools-template-prefix-check",
        summary="tools=[...]: a chat template TRL's old prefix check refuses but that keeps a tool call's turn as a "
        "prefix of the next one is used as it is, as TRL 1.1.0 checks",
        symptom="ValueError: The tokenizer's chat template is not prefix-preserving and patching is not supported for "
        "this template (GRPOTrainer(...) with tools; e.g. a template whose generation prompt opens <think>)",
        upstream="https://github.com/huggingface/trl/pull/5458 (fixed in 1.1.0)",
        fixed_in={"trl": "1.1.0"},
        changes=("get_training_chat_template",),
        # the check (PR #4300, 0.26.0) asks more than the tool loop needs once the loop appends suffix ids
        # (PR #5242, 0.29.1; 0.26.0 - 0.29.0 re-tokenise and need it); narrowed by PR #5458 (f19fda4c0,
        # 1.1.0.dev0): the probe tells the dev builds apart
        requires={"trl": affected("0.29.1", "1.1.0")},
        witnesses={"trl": {"inside": ["0.29.1", "1.0.0.dev0", "1.0.0", "1.1.0.dev0"], "outside": ["0.29.0", "1.1.0"]}},
        remove_when="TRL 0.29.1 - 1.0.x are no longer supported",
    ),
    # the one entry that wraps prepare_multimodal_messages (the trainer module's binding and trl.data_utils')
    Patch(
        id="vlm-tool-messages",
        summary="VLM prompts with a tool call's turns: prepare_multimodal_messages keeps tool messages and content-less "
        "assistant turns, and wraps their strings (an empty one too) in a text block, as TRL 1.1.0 does",
        symptom=(
            "ValueError: Invalid role in message: tool. Expected 'user', 'assistant', or 'system'. (0.26.0 - 0.29.0); "
            "TypeError: string indices must be integers, not 'str' (0.29.1 - 1.0.x): first step, images and tool turns"
        ),
        upstream=(
            "https://github.com/huggingface/trl/pull/5496 and https://github.com/huggingface/trl/pull/5440 (tool and "
            "empty strings wrapped: fixed in 1.1.0); https://github.com/huggingface/trl/pull/5212 (the tool role, in 0.29.1)"
        ),
        fixed_in={"trl": "1.1.0"},
        changes=MULTIMODAL_MESSAGES_BINDINGS,
        # tool calling came with PR #4300 (0.26.0); PR #5212 (0.29.1) took the tool role but left its string bare,
        # PRs #5440 (0cb9667f3) and #5496 (d4caab865, 1.1.0.dev0) wrap it: the probe tells the dev builds apart
        requires={"trl": affected("0.26.0", "1.1.0")},
        witnesses={
            "trl": {
                "inside": ["0.26.0.dev0", "0.26.0", "0.28.0", "0.29.0", "0.29.1", "1.0.0", "1.1.0.dev0"],
                "outside": ["0.25.1", "1.1.0"],
            }
        },
        remove_when="TRL 0.26.0 - 1.0.x are no longer supported",
    ),
    # -- advice: known breaks an upgrade ends ------------------------------------------------------
    # Known breaks with newer (or older) vLLM / transformers / peft that no fix here could be
    # proved for on the CPU (kind="advice"): the probe says "undecided" with the upgrade to make, so
    # the report names it and TRL_COMPAT_STRICT=1 stops at `import trl`. `changes` names what the
    # upstream shim changes, which no other entry declares.
    # "vllm" comes right after "trl" in requires: without vLLM the gate then says "vllm is not installed".
    Patch(
        id="vllm-disabled-tqdm",
        kind="advice",
        summary="advice only: vLLM < 0.11.1 with huggingface_hub 1.1 - 1.9 cannot download a model; upgrade vLLM",
        symptom="TypeError: ...__init__() got multiple values for keyword argument 'disable' (vLLM's DisabledTqdm, loading a model)",
        upstream="https://github.com/vllm-project/vllm/pull/28471 (fixed in vLLM 0.11.1; TRL shims it from 0.26.0, commit ca21dd94c)",
        fixed_in={"vllm": "0.11.1", "trl": "0.26.0"},
        trigger="trl.import_utils",
        must_exist="is_vllm_available",
        changes=("vllm.model_executor.model_loader.weight_utils:DisabledTqdm",),
        requires={
            # TRL 0.26.0 - 1.2.x shim it themselves (removed by PR #5549, 1.3.0): the probe reads the shim
            "trl": affected("0.14.0"),
            "vllm": affected("0.1.0", "0.11.1"),
            # 1.10.0 passes disable= only to huggingface_hub's own tqdm classes, never to vLLM's
            "huggingface_hub": affected("1.1.0", "1.10.0"),
        },
        witnesses={
            "trl": {"inside": ["0.14.0", "0.20.0", "0.25.1", "0.26.0.dev0", "1.2.0", "1.3.0", "1.16.0"], "outside": ["0.13.0"]},
            "vllm": {"inside": ["0.1.0", "0.10.2", "0.11.0", "0.11.1.dev0"], "outside": ["0.11.1", "0.12.0"]},
            "huggingface_hub": {"inside": ["1.1.0", "1.9.2"], "outside": ["0.36.2", "1.0.1", "1.10.0", "2.4.0"]},
        },
        remove_when="trl_compat no longer supports TRL < 0.26, nor TRL >= 1.3 with vLLM < 0.11.1",
    ),
    Patch(
        id="vllm-tokenizer-transformers5",
        kind="advice",
        summary="advice only: vLLM < 0.12 on transformers 5 cannot load the tokenizer; upgrade vLLM",
        symptom="AttributeError: ... has no attribute 'all_special_tokens_extended' (vLLM's get_cached_tokenizer)",
        upstream="https://github.com/vllm-project/vllm/pull/29686 (fixed in vLLM 0.12.0; TRL shims it from 0.26.0, commit ca21dd94c)",
        fixed_in={"vllm": "0.12.0", "trl": "0.26.0"},
        trigger="trl.import_utils",
        must_exist="is_vllm_available",
        changes=("vllm.transformers_utils.tokenizer:get_cached_tokenizer",),
        # TRL 0.26.0 - 1.2.x shim it themselves (removed by PR #5549, 1.3.0): the probe reads the shim
        requires={"trl": affected("0.14.0"), "vllm": affected("0.1.0", "0.12.0"), "transformers": affected("5.0.0")},
        witnesses={
            "trl": {"inside": ["0.14.0", "0.20.0", "0.25.1", "0.26.0.dev0", "1.2.0", "1.3.0", "1.16.0"], "outside": ["0.13.0"]},
            "vllm": {"inside": ["0.1.0", "0.10.2", "0.11.2", "0.12.0.dev0"], "outside": ["0.12.0", "0.14.0"]},
            "transformers": {"inside": ["5.0.0", "5.23.0"], "outside": ["4.57.6"]},
        },
        remove_when="trl_compat no longer supports TRL < 0.26, nor TRL >= 1.3 with vLLM < 0.12 on transformers 5",
    ),
    Patch(
        id="peft-transformers5-hybrid-cache",
        kind="advice",
        summary="advice only: peft < 0.18 cannot be imported on transformers 5, nor GRPOTrainer with it; upgrade peft",
        symptom="ImportError: cannot import name 'HybridCache' from 'transformers'",
        upstream="https://github.com/huggingface/peft/pull/2735 (fixed in peft 0.18.0; TRL shims it from 0.28.0, PR #4844)",
        fixed_in={"peft": "0.18.0", "trl": "0.28.0"},
        trigger="trl.import_utils",
        must_exist="_LazyModule",
        changes=("transformers:HybridCache", "transformers.cache_utils:HybridCache"),
        requires={"trl": affected("0.14.0", "0.28.0"), "transformers": affected("5.0.0"), "peft": affected("0.8.0", "0.18.0")},
        witnesses={
            "trl": {"inside": ["0.14.0", "0.19.1", "0.27.2", "0.28.0.dev0"], "outside": ["0.28.0"]},
            "transformers": {"inside": ["5.0.0", "5.23.0"], "outside": ["4.57.6"]},
            "peft": {"inside": ["0.8.0", "0.17.1", "0.18.0.dev0"], "outside": ["0.18.0", "0.21.2"]},
        },
        remove_when="trl_compat no longer supports TRL < 0.28 on transformers 5",
    ),
    # -- prompts and tools: truncation (TRL 0.24 - 0.25), the tool-calling loop (0.26 - 0.29.0) ----
    # prompt-right-truncation wraps __init__ after every older __init__ patch: it acts once TRL's
    # __init__ has set the processing class, and no window of theirs meets its own.
    Patch(
        id="prompt-right-truncation",
        summary="passed tokenizer: truncate prompts longer than max_prompt_length on the left (keep their end), as TRL "
        "does for one it loads",
        symptom="silent: prompts over max_prompt_length lose their END (question tail, generation header); no error",
        upstream=(
            "none in TRL (Unsloth patches it); PR #4153 (0.24.0) moved truncation to the tokenizer, PR #4300 removed it in 0.26.0"
        ),
        fixed_in={},
        changes=("GRPOTrainer.__init__",),
        requires={"trl": affected("0.24.0", "0.26.0")},
        # 0.24.0.dev0 builds before 0e57b4a9d truncate on the left themselves, 0.26.0.dev0 builds
        # from ca21dd94c not at all: the probe tells them apart.
        witnesses={"trl": {"inside": ["0.24.0.dev0", "0.24.0", "0.25.1", "0.26.0.dev0"], "outside": ["0.23.1", "0.26.0"]}},
        remove_when="TRL 0.24.x and 0.25.x are no longer supported",
    ),
    # Advice too, where its bug is: the fix is TRL's own series (0.29.1).
    Patch(
        id="tool-loop-retokenization",
        kind="advice",
        summary="not fixed in place (always undecided): tools=[...] on TRL 0.26.0 - 0.29.0 need the token-in/token-out "
        "series of TRL 0.29.1; the report says so",
        symptom=(
            "silent: with tools, the loss scores re-tokenised ids never sampled (or RuntimeError: The size of tensor a "
            "(...) must match the size of tensor b (...) at non-singleton dimension 1)"
        ),
        upstream=(
            "https://github.com/huggingface/trl/issues/5224 and #5144 (fixed in 0.29.1 by PRs #5225-#5242; "
            "crash-only PRs #5145, #5247 closed unmerged)"
        ),
        fixed_in={"trl": "0.29.1"},
        # what an in-place fix would change; apply() refuses: the probe never says "needed"
        changes=("GRPOTrainer._tool_call_loop",),
        # tools need transformers >= 5 in these releases. Main was 1.0.0.dev0 from 0.29.0 to the fix
        # (ebdfe826f): the window runs to 1.0.0, and the probe finds the fix in 0.29.1.
        requires={"trl": affected("0.26.0", "1.0.0"), "transformers": affected("5.0.0")},
        witnesses={
            "trl": {"inside": ["0.26.0.dev0", "0.26.0", "0.28.0", "0.29.0", "0.29.1", "1.0.0.dev0"], "outside": ["0.25.1", "1.0.0"]},
            "transformers": {"inside": ["5.0.0.dev0", "5.0.0", "5.2.0"], "outside": ["4.57.6"]},
        },
        remove_when="TRL 0.26.0 - 0.29.0 are no longer supported",
    ),
    # -- generation defaults -----------------------------------------------------------------------
    # wraps transformers' GenerationMixin.generate, which no other patch changes; it only adds
    # use_model_defaults=False to TRL's own sampling call
    Patch(
        id="generation-config-model-defaults",
        summary="no vLLM, transformers 4.50-4.57: TRL's sampling call gets use_model_defaults=False, so generate "
        "samples with TRL's temperature/top_p/top_k, not the model's generation_config defaults",
        symptom=(
            "silent: completions sampled at the model's generation_config temperature/top_p/top_k wherever TRL's "
            "value equals the global default (temperature=1.0, top_p=1.0), log-probs and KL at TRL's; near-greedy "
            "samples, zero reward std"
        ),
        upstream=(
            "https://github.com/huggingface/transformers/issues/42762 (transformers#36684, 4.50; fixed in 5.0 by "
            "#42702); fixed in TRL by https://github.com/huggingface/trl/pull/4647 (0.26.2, 0.27.0)"
        ),
        fixed_in={"trl": "0.26.2", "transformers": "5.0.0"},
        changes=("transformers.generation.utils:GenerationMixin.generate",),
        # trl: 0.26.2 holds the fix (the probe finds it); 0.27.0.dev0 builds before 8918c9836 do not.
        requires={"trl": affected("0.14.0", "0.27.0"), "transformers": affected("4.50.0", "5.0.0")},
        witnesses={
            "trl": {"inside": ["0.14.0", "0.17.0", "0.24.0", "0.26.1", "0.26.2", "0.27.0.dev0"], "outside": ["0.27.0", "0.29.1"]},
            "transformers": {"inside": ["4.50.0", "4.52.4", "4.57.6", "5.0.0.dev0"], "outside": ["4.49.0", "5.0.0"]},
        },
        remove_when="trl_compat no longer supports TRL < 0.26.2 on transformers 4.50 - 4.57",
    ),
    # wraps _generate_single_turn, which no other patch changes, and adds an after-hook to __init__
    # that only touches TRL's generation config
    Patch(
        id="generation-eos-ids",
        summary="no vLLM: every eos id the model's generation_config declares (end-of-turn tokens) stops generate "
        "and ends the completion, not only the tokenizer's EOS",
        symptom=(
            "silent: tokens sampled after an end-of-turn token the tokenizer's EOS is not (Gemma's <end_of_turn>, "
            "Llama 3's <|eot_id|>) are kept in the completion, rewarded and trained on"
        ),
        upstream="TRL's grpo_trainer.py, changed between the 1.14.1 and 1.14.2 wheels (fixed in 1.14.2)",
        fixed_in={"trl": "1.14.2"},
        changes=("GRPOTrainer.__init__", "GRPOTrainer._generate_single_turn"),
        # the bug is there from 0.14.0 (the mask) / 0.16.0 (generate); TRL < 0.24 computes the mask inline
        # in _generate_and_score_completions, where this patch does not reach
        requires={"trl": affected("0.24.0", "1.14.2")},
        witnesses={"trl": {"inside": ["0.24.0", "0.28.0", "1.0.0", "1.14.1", "1.14.2.dev0"], "outside": ["0.23.1", "1.14.2"]}},
        remove_when="trl_compat no longer supports TRL < 1.14.2",
    ),
    # -- rewards, evaluation and QLoRA (TRL 0.22 - 0.27) -------------------------------------------
    # scale-rewards-swapped (last: the outermost __init__ wrapper) only relabels, after TRL's
    # __init__, an attribute no other patch touches; no other __init__ patch applies on TRL 0.22.
    Patch(
        id="scale-rewards-swapped",
        summary='scale_rewards labels swapped in TRL 0.22.0/0.22.1: relabel so "group" (default) and "none" do what they say',
        symptom='silent: default scale_rewards="group" trains with unscaled advantages; "none" (Dr. GRPO) divides by the group std',
        upstream="https://github.com/huggingface/trl/issues/3991 (fixed by PR #3992 in 0.22.2)",
        fixed_in={"trl": "0.22.2"},
        changes=("GRPOTrainer.__init__",),
        # main carried the bug from fe44806b6 (0.22.0.dev0) to 35702ce37 (0.23.0.dev0); 0.22.2's fix is read by the probe.
        requires={"trl": affected("0.22.0", "0.23.0")},
        witnesses={"trl": {"inside": ["0.22.0", "0.22.1", "0.22.2", "0.23.0.dev0"], "outside": ["0.21.0", "0.23.0"]}},
        remove_when="TRL 0.22.0 and 0.22.1 are no longer supported",
    ),
    Patch(
        id="eval-before-train-ga",
        summary="evaluate() / eval_on_start before train(): the eval loss uses normaliser 1, as TRL 0.27.1 does",
        symptom="AttributeError: 'GRPOTrainer' object has no attribute 'current_gradient_accumulation_steps'",
        upstream="https://github.com/huggingface/trl/issues/4010 (also #4669, #4850; fixed by PR #4852 in 0.27.1)",
        fixed_in={"trl": "0.27.1"},
        must_exist="GRPOTrainer",  # compute_loss is TRL's in every affected release; the class is what must exist
        changes=("GRPOTrainer.compute_loss",),
        # introduced by PR #3938 (0.22.0.dev0); main fixed it in 7c4b6f169 (0.28.0.dev0), 0.27.1 by the probe.
        requires={"trl": affected("0.22.0", "0.28.0")},
        witnesses={
            "trl": {"inside": ["0.22.0", "0.24.0", "0.26.2", "0.27.0", "0.27.1", "0.28.0.dev0"], "outside": ["0.21.0", "0.28.0"]}
        },
        remove_when="TRL < 0.27.1 is no longer supported",
    ),
    Patch(
        id="qlora-peftmodel-frozen",
        summary="a 4/8-bit PeftModel given without peft_config: skip the k-bit preparation that froze its adapters (crashed 0.22)",
        symptom=(
            "ValueError: 'generation_batch_size' and 'steps_per_generation' can not be both configured at the same time "
            "(0.22.x; 0.23.0: element 0 of tensors does not require grad and does not have a grad_fn)"
        ),
        upstream="https://github.com/huggingface/trl/pull/4081 (fixed in 0.23.1; SFT twin issue #3926)",
        fixed_in={"trl": "0.23.1"},
        must_exist="prepare_peft_model",
        changes=("prepare_peft_model", "trl.models.utils:prepare_peft_model"),
        # introduced by PR #3882 (0.22.0.dev0); main fixed it in 7e2075347 (0.24.0.dev0), 0.23.1 by the probe.
        requires={"trl": affected("0.22.0", "0.24.0"), "peft": ">=0.0.dev0"},
        witnesses={"trl": {"inside": ["0.22.0", "0.22.1", "0.23.0", "0.23.1", "0.24.0.dev0"], "outside": ["0.21.0", "0.24.0"]}},
        remove_when="TRL 0.22.x and 0.23.0 are no longer supported",
    ),
    Patch(
        id="qlora-config-rebuild",
        summary="4/8-bit model on TRL 0.22.x: copy the config where prepare_peft_model rebuilt it (GRPOConfig rejected the rebuild)",
        symptom="ValueError: 'generation_batch_size' and 'steps_per_generation' can not be both configured at the same time",
        upstream="https://github.com/huggingface/trl/pull/3981 (fixed in 0.23.0)",
        fixed_in={"trl": "0.23.0"},
        must_exist="GRPOTrainer",  # the fix is on trl.models.utils, which the trigger module imports
        changes=("trl.models.utils:dataclasses",),
        # introduced by PR #3882 (0.22.0.dev0); main fixed it in 4c47b3281 (0.23.0.dev0).
        requires={"trl": affected("0.22.0", "0.23.0"), "peft": ">=0.0.dev0"},
        witnesses={"trl": {"inside": ["0.22.0", "0.22.2", "0.23.0.dev0"], "outside": ["0.21.0", "0.23.0"]}},
        remove_when="TRL 0.22.x is no longer supported",
    ),
    Patch(
        id="dora-magnitude-bf16",
        summary="QLoRA + DoRA: give the DoRA magnitude vectors back the dtype TRL's bf16 cast of the adapters took",
        symptom="silent: with a 4/8-bit model and use_dora=True the DoRA magnitude vectors never change (updates round away in bf16)",
        upstream="https://github.com/huggingface/trl/issues/7268 (fixed in 1.15.0)",
        fixed_in={"trl": "1.15.0"},
        changes=("GRPOTrainer.__init__",),
        # the cast came with PR #4577 (2af35fb0d, 0.26.0.dev0); TRL 0.14 - 0.25 cast elsewhere (peft_module_casting_to_bf16)
        requires={"trl": affected("0.26.0", "1.15.0"), "peft": ">=0.0.dev0"},
        witnesses={"trl": {"inside": ["0.26.0.dev0", "0.26.0", "1.0.0", "1.14.2", "1.15.0.dev0"], "outside": ["0.25.1", "1.15.0"]}},
        remove_when="TRL 0.26.0 - 1.14.x are no longer supported",
    ),
    # -- a PeftModel's reference adapter when its LoRA uses target_parameters (TRL 0.27 - 1.9) ------------
    # TRL 1.10.0's rule from both sides: a frozen "ref" copy where peft >= 0.20 accepts a second such adapter, the
    # base model where peft refuses it. Their GRPOTrainer.__init__ wrappers act on the model passed in, around
    # TRL's call; they stack inside zero3-peft-mixed-dtype, whose cast of a PeftModel's fp32 adapters (ZeRO-3,
    # DeepSpeed 0.19.2) must come first: it casts only where the frozen parameters share one 16-bit dtype, and
    # the "ref" copy, frozen, takes the dtype of the cast adapter.
    Patch(
        id="peft-target-parameters-ref-adapter",
        summary="PeftModel with target_parameters LoRA and beta > 0 on peft < 0.20: no 'ref' adapter, the reference is "
        "the base model, as TRL 1.7",
        symptom="ValueError: Adding a LoRA config with `target_parameters=[...]` but there are already other LoRA adapters "
        "on this model that use `target_parameters`. At the moment, only one LoRA adapter per model with "
        "`target_parameters` is allowed.",
        upstream="https://github.com/huggingface/trl/issues/5222 (fixed by PR #6043 in 1.7.0)",
        fixed_in={"trl": "1.7.0"},
        changes=("GRPOTrainer.__init__",),
        # PR #4723 (42cce51cf, 0.27.0.dev0) made the "ref" adapter; PR #6043 (0591272af, 1.7.0.dev0) skips it. peft
        # PR #2710 (0.17.1) brought the refusal, PR #3350 (0.20.0) lifted it: the probe reads peft's code for it
        requires={"trl": affected("0.27.0", "1.7.0"), "peft": affected("0.17.1", "0.20.0")},
        witnesses={
            "trl": {"inside": ["0.27.0.dev0", "0.27.0", "0.29.1", "1.0.0", "1.6.0", "1.7.0.dev0"], "outside": ["0.26.2", "1.7.0"]},
            "peft": {"inside": ["0.17.1", "0.18.1", "0.19.1"], "outside": ["0.17.0", "0.20.0"]},
        },
        remove_when="trl_compat no longer supports TRL 0.27.0 - 1.6.x on peft 0.17.1 - 0.19.x",
    ),
    Patch(
        id="peft-target-parameters-ref-copy",
        summary="PeftModel with target_parameters LoRA and beta > 0 on peft >= 0.20: the reference is a frozen 'ref' "
        "copy of the adapter, as TRL 1.10",
        symptom="silent: TRL 1.7 - 1.9 on peft >= 0.20 take the base model as the reference of a target_parameters "
        "PeftModel (and warn that peft cannot copy it): the KL pulls a trained adapter towards zero",
        upstream="TRL's grpo_trainer.py, changed between the 1.9.2 and 1.10.0 wheels (fixed in 1.10.0); peft PR #3350 "
        "(0.20.0) allows the copy",
        fixed_in={"trl": "1.10.0"},
        changes=("GRPOTrainer.__init__",),
        # PR #6043 (0591272af, 1.7.0.dev0) skips the copy for any target_parameters LoRA; 1.10.0 on peft < 0.20 only
        requires={"trl": affected("1.7.0", "1.10.0"), "peft": affected("0.20.0")},
        witnesses={
            "trl": {"inside": ["1.7.0.dev0", "1.7.0", "1.9.2", "1.10.0.dev0"], "outside": ["1.6.0", "1.10.0"]},
            "peft": {"inside": ["0.20.0", "0.21.2"], "outside": ["0.19.1"]},
        },
        remove_when="trl_compat no longer supports TRL 1.7.0 - 1.9.x",
    ),
    # -- multi-process runs and DeepSpeed version breaks (TRL 0.2x) --------------------------------
    Patch(
        id="entropy-mask-gather-hang",
        summary="top_entropy_quantile < 1 on several processes: pad the entropies across ranks before gathering (TRL 0.24's body)",
        symptom="RuntimeError: [...gloo...] op.preamble.length <= op.nbytes (gloo; NCCL hangs) at the first step on >= 2 processes",
        upstream="https://github.com/huggingface/trl/issues/3933, https://github.com/huggingface/trl/pull/4041 (fixed in 0.23.1)",
        fixed_in={"trl": "0.23.1"},
        changes=("GRPOTrainer.get_high_entropy_mask",),
        # the fix reached 0.23.1 as a cherry-pick and main as 0.24.0.dev0 (f4ff24840): the probe tells them apart
        requires={"trl": affected("0.21.0", "0.24.0")},
        # 0.20.0 takes a per-rank quantile (no collective); 0.21.0.dev0 builds before PR #3833 too: the probe tells.
        witnesses={"trl": {"inside": ["0.21.0", "0.22.2", "0.23.0", "0.23.1", "0.24.0.dev0"], "outside": ["0.20.0", "0.24.0"]}},
        remove_when="TRL 0.21.0 - 0.23.0 are no longer supported",
    ),
    # After peft-optional (which replaces the module's get_peft_model only where peft is missing, when this one
    # never applies): where both were installed, this wrapper would sit above it.
    Patch(
        id="zero3-peft-mixed-dtype",
        summary="ZeRO-3 + LoRA on a bf16 model, DeepSpeed 0.19.2: get_peft_model keeps the adapters in the model's dtype; "
        "a PeftModel passed in has its fp32 adapters cast to it",
        symptom="TypeError: output tensor must have the same type as input tensor (first optimizer step, _allgather_params_coalesced)",
        upstream=(
            "https://github.com/huggingface/trl/issues/6089, https://github.com/huggingface/trl/pull/6091 (TRL 1.7.0 passes "
            "autocast_adapter_dtype=False for peft_config; a PeftModel passed in: never fixed in TRL); "
            "https://github.com/deepspeedai/DeepSpeed/issues/8072 (fixed in DeepSpeed 0.19.3 by PRs #8073, #8113)"
        ),
        fixed_in={"deepspeed": "0.19.3"},  # TRL 1.7.0 fixed its peft_config path only
        # TRL 0.14 - 0.21 and 0.26+ call the module's get_peft_model; 0.22 - 0.25 go through trl.models.utils.prepare_peft_model.
        # TRL 1.7.0 fixed the peft_config path only: a model passed as a PeftModel still crashes (every TRL).
        changes=("get_peft_model", "trl.models.utils:get_peft_model", "GRPOTrainer.__init__"),
        requires={"trl": affected("0.14.0"), "deepspeed": affected("0.19.2", "0.19.3"), "peft": affected("0.12.0")},
        witnesses={
            "trl": {"inside": ["0.14.0", "0.24.0", "0.29.1", "1.0.0", "1.6.0", "1.7.0", "1.16.0"], "outside": ["0.13.2"]},
            "deepspeed": {"inside": ["0.19.2", "0.19.3.dev0"], "outside": ["0.19.1", "0.19.3", "0.19.8"]},
            "peft": {"inside": ["0.12.0", "0.17.1", "0.21.2"], "outside": ["0.11.1"]},
        },
        remove_when="trl_compat no longer supports DeepSpeed 0.19.2",
    ),
    # DAPO normaliser (TRL 0.22 - 1.9.0): dapo-masked-token-normalizer recounts num_items_in_batch as
    # _generate_and_score_completions returns it; dapo-generation-batch-normalizer rescales it per accumulation window
    # inside _compute_loss. Distinct attributes: each fix holds without the other.
    Patch(
        id="dapo-generation-batch-normalizer",
        summary="dapo/cispo/vespo loss: rescale the generation batch's token count to one accumulation window, as TRL 1.9.1",
        symptom="silent: steps_per_generation != gradient_accumulation_steps scales each step's loss by GA / steps_per_generation",
        upstream="https://github.com/huggingface/trl/issues/5619 (fixed by PR #6024 in 1.9.1; Liger loss: PR #5890)",
        trigger=GRPO_MODULE,
        must_exist="GRPOTrainer._compute_loss",
        changes=("GRPOTrainer._compute_loss",),
        # introduced by PR #3938 (2324245ca, 0.22.0.dev0); 1.9.1 is the first release with the rescale (wheel only).
        requires={"trl": affected("0.22.0", "1.9.1")},
        witnesses={
            "trl": {
                "inside": ["0.22.0", "0.24.0", "0.29.1", "1.0.0", "1.4.0", "1.9.0", "1.9.1.dev0"],
                "outside": ["0.21.0", "1.9.1", "1.16.0"],
            }
        },
        fixed_in={"trl": "1.9.1"},
        remove_when="TRL < 1.9.1 is no longer supported",
    ),
    Patch(
        id="dapo-masked-token-normalizer",
        summary="dapo/cispo/vespo loss: count num_items_in_batch over the loss mask (after mask_truncated_completions), as TRL 1.9.0",
        symptom="silent: mask_truncated_completions: the loss is also divided by the truncated completions' tokens: smaller gradients",
        upstream="https://github.com/huggingface/trl/pull/6439 (fixed in 1.9.0)",
        trigger=GRPO_MODULE,
        must_exist="GRPOTrainer._generate_and_score_completions",
        changes=("GRPOTrainer._generate_and_score_completions",),
        # introduced by PR #3938 (2324245ca, 0.22.0.dev0); main fixed it in 7c1fa85ad (1.9.0.dev0), read by the probe.
        requires={"trl": affected("0.22.0", "1.9.0")},
        witnesses={
            "trl": {
                "inside": ["0.22.0", "0.24.0", "0.29.1", "1.0.0", "1.4.0", "1.8.0", "1.9.0.dev0"],
                "outside": ["0.21.0", "1.9.0", "1.16.0"],
            }
        },
        fixed_in={"trl": "1.9.0"},
        remove_when="TRL < 1.9.0 is no longer supported",
    ),
    # none-reward-baseline also wraps _generate_and_score_completions, for another key of the batch it returns
    # (advantages, not num_items_in_batch): the two stack in either order.
    Patch(
        id="none-reward-baseline",
        summary="completions every reward function declined (None) are left out of the group baseline and get advantage 0, as TRL 1.6",
        symptom="silent: a completion no reward function scored gets reward 0, shifts its group's mean and std and gets an advantage",
        upstream="https://github.com/huggingface/trl/pull/5902 (fixed in 1.6.0)",
        trigger=GRPO_MODULE,
        must_exist="GRPOTrainer._calculate_rewards",
        changes=("GRPOTrainer._calculate_rewards", "GRPOTrainer._generate_and_score_completions"),
        # the bug is there from 0.16.0 (87fbb831d: None becomes NaN, nansum); 0.16 - 0.18 score rewards
        # inline, where the patch does not reach: from 0.19.0 (_calculate_rewards). 1c7c7f988 (1.6.0.dev0)
        # fixed it, read by the probe.
        requires={"trl": affected("0.19.0", "1.6.0")},
        witnesses={
            "trl": {"inside": ["0.19.0", "0.22.1", "0.29.1", "1.0.0", "1.5.0", "1.6.0.dev0"], "outside": ["0.18.2", "1.6.0", "1.16.0"]}
        },
        fixed_in={"trl": "1.6.0"},
        remove_when="TRL < 1.6.0 is no longer supported",
    ),
    # none-reward-warning-state wraps _calculate_rewards too (none-reward-baseline keeps its result): the two
    # stack in either order.
    Patch(
        id="none-reward-warning-state",
        summary="the warning for a row every reward function declined (None) no longer indexes the trainer's state",
        symptom="TypeError: 'TrainerState' object is not subscriptable "
        "(the first batch with a completion every reward function returned None for)",
        upstream="https://github.com/huggingface/trl/pull/3936 (fixed in 0.22.0)",
        trigger=GRPO_MODULE,
        must_exist="GRPOTrainer._calculate_rewards",
        changes=("GRPOTrainer._calculate_rewards",),
        # PR #3669 put trainer_state into the reward kwargs (0.20.0.dev0); e2eaa2334 (0.22.0.dev0) fixed the
        # warning: the probe reads both.
        requires={"trl": affected("0.20.0", "0.22.0")},
        witnesses={"trl": {"inside": ["0.20.0", "0.21.0", "0.22.0.dev0"], "outside": ["0.19.1", "0.22.0", "1.16.0"]}},
        fixed_in={"trl": "0.22.0"},
        remove_when="TRL < 0.22.0 is no longer supported",
    ),
    Patch(
        id="peft-zero3-gc-reentrant",
        summary="PEFT + ZeRO-3 + gradient checkpointing: use_reentrant=True before GRPOTrainer.__init__, as TRL 1.9 does",
        symptom="torch.utils.checkpoint.CheckpointError: Recomputed values for the following tensors have different metadata "
        "than during the forward pass (first backward)",
        upstream=(
            "https://github.com/huggingface/trl/issues/5217, https://github.com/huggingface/trl/pull/6356 (fixed in 1.9.0); "
            "https://github.com/huggingface/transformers/issues/47254"
        ),
        trigger=GRPO_MODULE,
        must_exist="GRPOTrainer",
        changes=("GRPOTrainer.__init__",),
        # 0.27.0 (PR #4811) made non-reentrant checkpointing the default of GRPO on transformers < 5 (transformers 5: its own)
        requires={"trl": affected("0.27.0", "1.9.0"), "peft": ">=0.0.dev0", "deepspeed": ">=0.0.dev0"},
        witnesses={"trl": {"inside": ["0.27.0", "0.29.1", "1.0.0", "1.8.0", "1.9.0.dev0"], "outside": ["0.26.2", "1.9.0", "1.16.0"]}},
        fixed_in={"trl": "1.9.0"},
        remove_when="trl_compat no longer supports TRL 1.8.x",
    ),
    # -- crashes of TRL 1.x pins, and the crash gaps left in 0.x --------------------------------------
    Patch(
        id="requests-optional",
        summary="TRL 0.28 - 1.14.1 without `requests`: the vLLM client module's top-level requests/urllib3 imports made "
        "optional, so the trainer imports; server mode still says requests is missing",
        symptom="`from trl import GRPOTrainer`: ModuleNotFoundError: No module named 'requests' (a `pip install trl peft` "
        "with transformers 5 and datasets >= 5.1, which no longer pull requests in)",
        upstream="TRL PR #4845 (0.28.0) brought the top-level import; TRL 1.14.2 imports requests lazily (fixed in 1.14.2)",
        fixed_in={"trl": "1.14.2"},
        # The package, as vllm-guided-decoding-import: the fix must be in place before the client module
        # runs (see the patch's docstring).
        trigger="trl",
        must_exist="__file__",
        changes=("trl.generation.vllm_client:HTTPAdapter", "trl.generation.vllm_client:Retry"),
        # 1.14.2 is a patch release; main's 1.15.0.dev0 builds are outside (no build of them is known to
        # carry the import); the probe tells the 1.14.2.dev0 builds apart.
        requires={"trl": affected("0.28.0", "1.14.2")},
        witnesses={
            "trl": {"inside": ["0.28.0", "0.29.1", "1.9.2", "1.14.1", "1.14.2.dev0"], "outside": ["0.27.2", "1.14.2", "1.16.0"]}
        },
        remove_when="trl_compat no longer supports TRL 0.28.0 - 1.14.1",
    ),
    Patch(
        id="fused-lm-head-no-triton",
        summary="TRL 1.15.0 where Triton cannot run (no Triton, or a CPU device): the fused LM head's log-probs "
        "computed in torch, as 1.16.0 falls back",
        symptom="AttributeError: 'NoneType' object has no attribute 'apply' at the first GRPO step (torch without "
        "Triton: the CPU, macOS and Windows wheels; with Triton on a CPU device, Triton's launcher fails)",
        upstream="TRL 1.15.0 added add_fused_lm_head on a Triton-only kernel; 1.16.0 folds its tiles in torch "
        "where Triton cannot run (fixed in 1.16.0)",
        fixed_in={"trl": "1.16.0"},
        changes=("trl.trainer.utils:_ChunkedLogProbFunction",),
        # the fused head came in 1.15.0 (the 1.14.2 wheel has none); the probe tells the dev builds apart
        requires={"trl": affected("1.15.0", "1.16.0")},
        witnesses={"trl": {"inside": ["1.15.0.dev0", "1.15.0", "1.16.0.dev0"], "outside": ["1.14.2", "1.16.0"]}},
        remove_when="TRL 1.15.x is no longer supported",
    ),
    Patch(
        id="reward-func-partial-name",
        summary="a functools.partial or callable instance as reward function gets the name TRL 1.9 gives it",
        symptom="AttributeError: 'functools.partial' object has no attribute '__name__' (GRPOTrainer(...); TRL < 0.17: first step)",
        upstream="https://github.com/huggingface/trl/pull/6313 (fixed in 1.9.0)",
        changes=("GRPOTrainer.__init__",),
        # main reported 1.9.0.dev0 before PR #6313 (bc6e8007b): the probe tells them apart
        requires={"trl": affected("0.14.0", "1.9.0")},
        witnesses={"trl": {"inside": ["0.14.0", "0.22.2", "0.29.1", "1.0.0", "1.8.0", "1.9.0.dev0"], "outside": ["1.9.0", "1.10.0"]}},
        fixed_in={"trl": "1.9.0"},
        remove_when="trl_compat no longer supports TRL < 1.9.0",
    ),
    Patch(
        id="vllm-weight-transfer-0.28",
        summary="vLLM >= 0.28: the static NCCL trainer API TRL 1.11/1.12 import put back on vLLM's helpers; "
        "packed announced at init, not per update, as TRL 1.13",
        symptom="`from trl import GRPOTrainer`: ImportError: cannot import name 'NCCLTrainerSendWeightsArgs' from "
        "'vllm.distributed.weight_transfer.nccl_engine'; server mode: the first weight sync rejected",
        upstream="vLLM PR #50902 removed the static API (vLLM 0.28.0); TRL 1.13.0's _HAS_STATEFUL_TRAINER_ENGINE (fixed in 1.13.0)",
        fixed_in={"trl": "1.13.0"},
        # The package, as vllm-guided-decoding-import: TRL's client module imports the names while it is
        # itself being imported (see the patch's docstring).
        trigger="trl",
        must_exist="__file__",
        changes=(
            "vllm.distributed.weight_transfer.nccl_engine:NCCLTrainerSendWeightsArgs",
            "vllm.distributed.weight_transfer.nccl_engine:NCCLWeightTransferEngine.trainer_init",
            "vllm.distributed.weight_transfer.nccl_engine:NCCLWeightTransferEngine.trainer_send_weights",
            "trl.generation.vllm_client:VLLMClient._post",
        ),
        # trl: PR #6765 (1.11.0.dev0) brought the static calls, 1.13.0 branched on the stateful engine; the probe
        # reads which. vllm: #50902 removed the statics in 0.28.0.
        requires={"trl": affected("1.11.0", "1.13.0"), "vllm": affected("0.28.0")},
        witnesses={
            "trl": {"inside": ["1.11.0", "1.12.0", "1.13.0.dev0"], "outside": ["1.10.0", "1.13.0", "1.16.0"]},
            "vllm": {"inside": ["0.28.0", "0.31.0"], "outside": ["0.27.1"]},
        },
        remove_when="trl_compat no longer supports TRL 1.11.x and 1.12.x",
    ),
    # reset_prefix_cache is no other patch's (vllm-weight-transfer-0.28 wraps _post, which the fix no longer calls)
    Patch(
        id="vllm-server-reset-prefix-cache",
        summary="server mode: an empty answer to /reset_prefix_cache (vLLM < 0.26) ends the weight sync, as TRL 1.14.1",
        symptom="server mode with vLLM < 0.26: the first weight sync raises requests.exceptions.JSONDecodeError: "
        "Expecting value: line 1 column 1 (char 0)",
        upstream="vLLM PR #46893 (0.26.0) gave /reset_prefix_cache a JSON body; TRL 1.14.1 reads no body from an older "
        "vLLM (fixed in 1.14.1)",
        fixed_in={"trl": "1.14.1"},
        trigger="trl.generation.vllm_client",
        must_exist="VLLMClient.reset_prefix_cache",
        changes=("VLLMClient.reset_prefix_cache",),
        # the client moved to vLLM's own server in 1.11.0 (1.10 posts to trl vllm-serve's endpoint itself); 1.14.1
        # branches on the vLLM version, read by the probe
        # use_vllm needs vLLM installed on the trainer's side too (VLLMGeneration refuses to start without it)
        requires={"trl": affected("1.11.0", "1.14.1"), "vllm": ">=0"},
        witnesses={"trl": {"inside": ["1.11.0.dev0", "1.11.0", "1.12.0", "1.14.0", "1.14.1.dev0"], "outside": ["1.10.0", "1.14.1"]}},
        remove_when="trl_compat no longer supports TRL 1.11.0 - 1.14.0",
    ),
    Patch(
        id="server-logprobs-mode-check",
        summary="server mode with the IS correction: the vLLM server's --logprobs-mode is checked when the trainer is "
        "built, as TRL 1.16.0",
        symptom="silent: vllm_mode='server' against a server not started with --logprobs-mode processed_logprobs: the "
        "importance sampling correction divides by raw log-probs",
        upstream="TRL's grpo_trainer.py, changed between the 1.15.0 and 1.16.0 wheels (a warning; fixed in 1.16.0); "
        "server mode talks to vLLM's own server from 1.11.0",
        fixed_in={"trl": "1.16.0"},
        changes=("GRPOTrainer.__init__",),
        # 1.11.0 moved server mode to vLLM's own server, whose log-probs mode the user chooses; 1.16.0 reads it,
        # as the probe does
        requires={"trl": affected("1.11.0", "1.16.0"), "vllm": ">=0"},
        witnesses={"trl": {"inside": ["1.11.0.dev0", "1.11.0", "1.12.0", "1.15.0", "1.16.0.dev0"], "outside": ["1.10.0", "1.16.0"]}},
        remove_when="trl_compat no longer supports TRL 1.11.0 - 1.15.x",
    ),
    # -- environments (TRL 0.29 - 1.8.x) ---------------------------------------------------------------
    Patch(
        id="environment-prompt-mutation",
        summary="environment_factory: TRL appends each reset observation to a copy of the example's last message, as TRL 1.9",
        symptom="silent: environment_factory: the examples handed to _generate_and_score_completions keep the observation; "
        "scored again, their prompts carry it twice",
        upstream="https://github.com/huggingface/trl/pull/6364 (fixed in 1.9.0)",
        trigger=GRPO_MODULE,
        must_exist="GRPOTrainer._generate_and_score_completions",
        changes=("GRPOTrainer._generate_and_score_completions",),
        # environment_factory arrived in 0.29.0 with the in-place loop; 66d9b8da7 (1.9.0.dev0) fixed it, read by the probe.
        requires={"trl": affected("0.29.0", "1.9.0")},
        witnesses={
            "trl": {"inside": ["0.29.0", "0.29.1", "1.0.0", "1.4.0", "1.8.0", "1.9.0.dev0"], "outside": ["0.28.0", "1.9.0", "1.16.0"]}
        },
        fixed_in={"trl": "1.9.0"},
        remove_when="trl_compat no longer supports TRL < 1.9.0",
    ),
    # -- generation and optimizer steps out of step (TRL 0.18 - 0.19.x) ---------------------------------
    Patch(
        id="misaligned-generation-old-logps",
        summary="gradient_accumulation_steps not a multiple of steps_per_generation: old log-probs computed after generation, "
        "as TRL 0.20",
        symptom="silent: slices of a generation trained after an optimizer step get importance ratio 1 and no clipping "
        "(e.g. gradient_accumulation_steps=3, steps_per_generation=2)",
        upstream="https://github.com/huggingface/trl/pull/3725 (fixed in 0.20.0)",
        trigger=GRPO_MODULE,
        must_exist="GRPOTrainer._generate_and_score_completions",
        changes=("GRPOTrainer._generate_and_score_completions",),
        # steps_per_generation arrived in 0.18.0; 508d551db (0.20.0.dev0) fixed it, read by the probe.
        requires={"trl": affected("0.18.0", "0.20.0")},
        witnesses={
            "trl": {"inside": ["0.18.0", "0.18.2", "0.19.0", "0.19.1", "0.20.0.dev0"], "outside": ["0.17.0", "0.20.0", "1.0.0"]}
        },
        fixed_in={"trl": "0.20.0"},
        remove_when="trl_compat no longer supports TRL < 0.20.0",
    ),
    # -- tools in server mode (TRL 1.0 - 1.14.0) ------------------------------------------------------
    # wraps _tool_call_loop; tool-loop-retokenization declares it too but never applies (advice), and
    # its window ends where this one begins
    Patch(
        id="tool-loop-server-generations",
        summary='tools with vllm_mode="server": each post-tool turn generates one completion per history (n=1), as TRL 1.14.1 does',
        symptom=(
            "silent: after a tool call only every num_generations-th history reaches the server (n=num_generations); "
            "the other samples are trained on continuations of a neighbour's conversation"
        ),
        upstream=(
            "TRL's grpo_trainer.py, changed between the 1.14.0 and 1.14.1 wheels (fixed in 1.14.1); server mode reached "
            "the tool loop from PR #5235 (1.0.0)"
        ),
        fixed_in={"trl": "1.14.1"},
        must_exist="GRPOTrainer._tool_call_loop",
        changes=("GRPOTrainer._tool_call_loop",),
        # the loop refused server mode before c0e3fb0c5 (PR #5235, main 1.0.0.dev0) and passes
        # num_generations=1 once fixed: the probe reads both, so it tells the dev builds at each end apart
        requires={"trl": affected("1.0.0", "1.14.1")},
        witnesses={
            "trl": {"inside": ["1.0.0.dev0", "1.0.0", "1.9.2", "1.14.0", "1.14.1.dev0"], "outside": ["0.29.1", "1.14.1", "1.16.0"]}
        },
        remove_when="trl_compat no longer supports TRL 1.0.0 - 1.14.0",
    ),
    # -- config settings TRL did not honour ----------------------------------------------------------
    # metric-for-best-model wraps GRPOTrainer.log, as grpo-eval-0.14 does on 0.14.0: both only on 0.15.0.dev0 builds
    Patch(
        id="metric-for-best-model",
        summary="GRPOTrainer.log adds its metrics to the caller's dict, as TRL 1.5 does: evaluate() returns eval_reward & co.",
        symptom="KeyError: The `metric_for_best_model` training argument is set to 'eval_reward', which is not found in "
        "the evaluation metrics (first evaluation of train())",
        upstream="https://github.com/huggingface/trl/pull/5811 (fixed in 1.5.0)",
        changes=("GRPOTrainer.log",),
        # 0.15.0 brought GRPO's evaluation (prediction_step, the eval_ prefix) with log's new dict;
        # 4711a21d6 (1.5.0.dev0) fixed it, read by the probe
        requires={"trl": affected("0.15.0", "1.5.0")},
        witnesses={
            "trl": {
                "inside": ["0.15.0", "0.16.1", "0.22.1", "0.29.1", "1.0.0", "1.4.0", "1.5.0.dev0"],
                "outside": ["0.14.0", "1.5.0", "1.16.0"],
            }
        },
        fixed_in={"trl": "1.5.0"},
        remove_when="trl_compat no longer supports TRL < 1.5.0",
    ),
    # -- the loss of TRL 1.x pins ---------------------------------------------------------------------
    # luspo-unmasked-loss wraps _compute_loss as dapo-generation-batch-normalizer does: that one acts on
    # dapo/cispo/vespo only and this one on luspo (run as dr_grpo), so the two stack in either order.
    Patch(
        id="luspo-unmasked-loss",
        summary="loss_type='luspo': the per-token loss is masked before each sequence's sum, as TRL 1.10.0",
        symptom="silent: loss_type='luspo' with token-level importance sampling (the default), a KL term or the entropy "
        "mask: pad tokens enter the loss, each sequence weighted by L^2/T instead of L",
        upstream="https://github.com/huggingface/trl/pull/6654 (fixed in 1.10.0)",
        trigger=GRPO_MODULE,
        must_exist="GRPOTrainer._compute_loss",
        changes=("GRPOTrainer._compute_loss",),
        # luspo came with PR #4988 (ff55949cc, 0.28.0); the wheels of 0.28.0 - 1.9.2 hold the buggy line, 1.10.0 the
        # fix, read by the probe (main before PR #4988 has no luspo: "not needed")
        requires={"trl": affected("0.28.0", "1.10.0")},
        witnesses={
            "trl": {
                "inside": ["0.28.0", "0.29.1", "1.0.0", "1.4.0", "1.9.2", "1.10.0.dev0"],
                "outside": ["0.27.1", "1.10.0", "1.16.0"],
            }
        },
        fixed_in={"trl": "1.10.0"},
        remove_when="TRL < 1.10.0 is no longer supported",
    ),
    # -- ZeRO-3 generation: the coordinator trace after TRL's add_hooks (TRL < 1.5, DeepSpeed < 0.19.2) -----------
    # Stacks above zero3-hooks-api (TRL 0.14 - 0.15 with DeepSpeed >= 0.16.4), which also wraps add_hooks: the trace is
    # invalidated first, then either re-registers the hooks; neither depends on the other.
    Patch(
        id="zero3-hooks-trace",
        summary="ZeRO-3 generation: add_hooks invalidates DeepSpeed's coordinator trace before re-registering the hooks, as TRL 1.5.0",
        symptom="IndexError: pop from an empty deque (record_parameters, the second step's first forward; ZeRO-3 + PEFT)",
        upstream=(
            "https://github.com/huggingface/trl/pull/4693 (fixed in 1.5.0); "
            "https://github.com/deepspeedai/DeepSpeed/pull/8043 (DeepSpeed 0.19.2 invalidates it itself)"
        ),
        fixed_in={"trl": "1.5.0"},
        trigger="trl.models.utils",
        must_exist="add_hooks",
        changes=("add_hooks",),
        # TRL's remove_hooks/add_hooks leave the trace stale since they came (PR #1483, 0.8.2): from GRPOTrainer's first
        # release. main fixed it in aad3b6d71 (1.5.0.dev0), DeepSpeed in 0.19.2: the probe reads both.
        requires={"trl": affected("0.14.0", "1.5.0"), "deepspeed": affected("0.0.0", "0.19.2")},
        witnesses={
            "trl": {"inside": ["0.14.0", "0.16.1", "0.24.0", "1.0.0", "1.4.0", "1.5.0.dev0"], "outside": ["1.5.0", "1.16.0"]},
            "deepspeed": {"inside": ["0.16.3", "0.16.4", "0.18.0", "0.19.1", "0.19.2.dev0"], "outside": ["0.19.2", "0.19.8"]},
        },
        remove_when="trl_compat no longer supports TRL < 1.5.0 with DeepSpeed < 0.19.2",
    ),
    # -- GRPOConfig validation that refuses a valid config or lets a crashing one through -------------
    Patch(
        id="eval-one-generation-nan",
        summary="evaluation with num_generations_eval=1: a group of one gets std 0 and advantage 0, as TRL 0.27",
        symptom="silent: eval_loss, eval_reward_std and every eval advantage NaN with num_generations_eval=1",
        upstream="https://github.com/huggingface/trl/pull/4662 (fixed in 0.27.0)",
        trigger=GRPO_MODULE,
        must_exist="GRPOTrainer._generate_and_score_completions",
        changes=("GRPOTrainer._generate_and_score_completions",),
        # num_generations_eval came in 0.26.0 (0.26.0.dev0); 37ad7c2e7 (0.27.0.dev0) fixed it: the probe reads both
        requires={"trl": affected("0.26.0", "0.27.0")},
        witnesses={"trl": {"inside": ["0.26.0", "0.26.2", "0.27.0.dev0"], "outside": ["0.25.1", "0.27.0", "1.16.0"]}},
        fixed_in={"trl": "0.27.0"},
        remove_when="TRL < 0.27.0 is no longer supported",
    ),
    Patch(
        id="num-generations-eval-check",
        summary="the global eval batch is checked against num_generations_eval (when set), as TRL 0.26.1 does",
        symptom="ValueError: The global eval batch size (2 * 1) must be divisible by num_generations (4). "
        "(num_generations_eval=2); the reverse passes and evaluate() raises shape '[-1, 4]' is invalid",
        upstream="https://github.com/huggingface/trl/pull/4682 (fixed in 0.26.1)",
        trigger="trl.trainer.grpo_config",
        must_exist="GRPOConfig",
        changes=("GRPOConfig.__post_init__",),
        # num_generations_eval came with db4f6e5aa (0.26.0.dev0); the fix reached 0.26.1 as a cherry-pick (2f62f3d03)
        # and main as 0.27.0.dev0 (8bc520d36): the probe tells 0.26.1, 0.26.2 and main's builds apart
        requires={"trl": affected("0.26.0", "0.27.0")},
        witnesses={"trl": {"inside": ["0.26.0.dev0", "0.26.0", "0.26.2", "0.27.0.dev0"], "outside": ["0.25.1", "0.27.0"]}},
        fixed_in={"trl": "0.26.1"},
        remove_when="trl_compat no longer supports TRL 0.26.0",
    ),
    # wraps GRPOConfig.__post_init__ too, above num-generations-eval-check; their windows never meet
    Patch(
        id="generation-batch-size-check",
        summary="several processes: a generation_batch_size the global batch does not divide is refused, as TRL 0.19.1 does",
        symptom="2+ processes, generation_batch_size=6 on a global batch of 4: RuntimeError: shape '[-1, 3]' is invalid "
        "for input of size 4 (num_generations=3), or silently some prompts never trained and others twice (num_iterations=2)",
        upstream="https://github.com/huggingface/trl/pull/3658 (fixed in 0.19.1)",
        trigger="trl.trainer.grpo_config",
        must_exist="GRPOConfig",
        changes=("GRPOConfig.__post_init__",),
        # cf5183db7 (main, 0.18.0.dev0) brought the check with generation_batch_size (released in 0.18.0); 9155c8fbb
        # (main) and its cherry-pick 6a6d4345c (0.19.1) fixed it. The probe tells the builds in the window apart.
        requires={"trl": affected("0.18.0", "0.19.1")},
        witnesses={"trl": {"inside": ["0.18.0.dev0", "0.18.0", "0.18.2", "0.19.0"], "outside": ["0.17.0", "0.19.1", "0.20.0"]}},
        fixed_in={"trl": "0.19.1"},
        remove_when="trl_compat no longer supports TRL < 0.19.1",
    ),
    # -- the entropy bonus of TRL 1.8 - 1.9 -----------------------------------------------------------------
    # entropy-coef-normalizer wraps _compute_loss above dapo-generation-batch-normalizer (TRL 1.8.0 - 1.9.0): it reads
    # the normaliser TRL computed through that patch's rescaled_inputs; above luspo-unmasked-loss it acts on
    # dapo/cispo/vespo only, that one on luspo.
    Patch(
        id="entropy-coef-normalizer",
        summary="entropy_coef with loss_type dapo/cispo/vespo: the bonus is the mean entropy over the masked tokens, as TRL 1.10.0",
        symptom="silent: entropy_coef with loss_type dapo/cispo/vespo: the bonus is divided by the policy loss's token count "
        "(the masked-out tokens of top_entropy_quantile < 1 included): another strength than the same coefficient elsewhere",
        upstream="https://github.com/huggingface/trl/pull/6140 brought it (1.8.0); fixed in 1.10.0",
        trigger=GRPO_MODULE,
        must_exist="GRPOTrainer._compute_loss",
        changes=("GRPOTrainer._compute_loss",),
        # entropy_coef came with PR #6140 (34c7f0d85, 1.8.0.dev0); the wheels of 1.8.0 - 1.9.2 hold the buggy line,
        # 1.10.0 the fix, read by the probe (main before PR #6140 has no entropy bonus: "not needed")
        requires={"trl": affected("1.8.0", "1.10.0")},
        witnesses={
            "trl": {
                "inside": ["1.8.0", "1.9.0", "1.9.1", "1.9.2", "1.10.0.dev0"],
                "outside": ["1.7.0", "1.10.0", "1.16.0"],
            }
        },
        fixed_in={"trl": "1.10.0"},
        remove_when="TRL < 1.10.0 is no longer supported",
    ),
    # -- cast_lm_head_to_fp32 under ZeRO-3 / FSDP (TRL 0.25 - 1.8) ------------------------------------
    # its GRPOTrainer.__init__ wrapper acts after TRL's __init__, on the LM heads' forward only, which no other
    # patch touches: its place among the others does not matter
    Patch(
        id="lm-head-fp32-sharded",
        summary="cast_lm_head_to_fp32: the LM head casts its weight to fp32 at each call, as TRL 1.9.0, not once at "
        "init (ZeRO-3 / FSDP gather it back in bf16)",
        symptom="RuntimeError: expected m1 and m2 to have the same dtype, but got: float != c10::BFloat16 (first generation; "
        "cast_lm_head_to_fp32=True under ZeRO-3 or FSDP with bf16)",
        upstream="https://github.com/huggingface/trl/pull/6330 (fixed in 1.9.0)",
        fixed_in={"trl": "1.9.0"},
        changes=("GRPOTrainer.__init__",),
        # cast_lm_head_to_fp32 came with PR #4303 (41c8ca1ad, 0.25.0.dev0); main fixed it in 7eaaf64a5 (1.9.0.dev0):
        # the probe reads both
        requires={"trl": affected("0.25.0", "1.9.0")},
        witnesses={
            "trl": {
                "inside": ["0.25.0.dev0", "0.25.0", "0.26.2", "0.29.1", "1.0.0", "1.8.0", "1.9.0.dev0"],
                "outside": ["0.24.0", "1.9.0", "1.16.0"],
            }
        },
        remove_when="trl_compat no longer supports TRL 0.25.0 - 1.8.x",
    ),
    # -- the reference model (TRL 0.26 - 1.15) ----------------------------------------------------------
    # its GRPOTrainer.__init__ wrapper only notes the trainer being built: its place among the others does not matter
    Patch(
        id="ref-model-like-policy",
        summary="beta > 0: the reference model is loaded in the policy's dtype and attention implementation, as TRL 1.16.0",
        symptom="silent: beta > 0 with a model passed in bf16 (or its own attn_implementation): a float32 (default-attention) "
        "reference; the KL term is not zero at the first step and pulls towards the unrounded weights",
        upstream="TRL's grpo_trainer.py, changed between the 1.15.0 and 1.16.0 wheels (fixed in 1.16.0); the reference is "
        "reloaded for every non-PEFT run since PR #3575 (0.19.0), through create_model_from_path since PR #4577 (0.26.0)",
        fixed_in={"trl": "1.16.0"},
        changes=("GRPOTrainer.__init__", "create_model_from_path"),
        # PR #4577 (2af35fb0d, 0.26.0.dev0) brought the create_model_from_path line this patch corrects; 0.19 - 0.25 load
        # the reference with from_pretrained (not patched); 1.16.0 sets the two defaults, read by the probe
        requires={"trl": affected("0.26.0", "1.16.0")},
        witnesses={
            "trl": {
                "inside": ["0.26.0.dev0", "0.26.0", "0.27.1", "0.29.1", "1.0.0", "1.9.2", "1.15.0", "1.16.0.dev0"],
                "outside": ["0.20.0", "0.25.1", "1.16.0"],
            }
        },
        remove_when="trl_compat no longer supports TRL 0.26.0 - 1.15.x",
    ),
    # -- a VLM on several processes (TRL 0.20 - 1.15) --------------------------------------------------------
    # its GRPOTrainer.__init__ wrapper acts after TRL's __init__ on args and the accelerator's DDP handler, which no
    # other wrapper reads or changes: its place among the others does not matter
    Patch(
        id="vlm-ddp-find-unused",
        summary="a VLM under DDP: ddp_find_unused_parameters=True unless the user set it or checkpointing is reentrant, as TRL 1.16.0",
        symptom="RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one "
        "(a text-only batch leaves the vision tower without gradients under gradient checkpointing)",
        upstream="TRL's grpo_trainer.py, changed between the 1.15.0 and 1.16.0 wheels (fixed in 1.16.0); "
        "https://github.com/huggingface/transformers/issues/49443",
        fixed_in={"trl": "1.16.0"},
        changes=("GRPOTrainer.__init__",),
        # 0.20.0 brought the ProcessorMixin processing class (VLMs) into GRPOTrainer; 1.16.0 sets the flag itself
        requires={"trl": affected("0.20.0", "1.16.0")},
        witnesses={
            "trl": {
                "inside": ["0.20.0.dev0", "0.20.0", "0.22.1", "0.29.1", "1.0.0", "1.12.0", "1.15.0", "1.16.0.dev0"],
                "outside": ["0.19.1", "1.16.0"],
            }
        },
        remove_when="trl_compat no longer supports TRL 0.20.0 - 1.15.x",
    ),
    # -- the KL term (TRL 0.26+) ---------------------------------------------------------------------------
    # Open upstream: no release has fixed it, so the window stays open and the probe watches for the fix.
    # kl-bias-correction-sequence wraps _compute_loss outermost: for the duration of TRL's call it sets
    # use_bias_correction_kl, beta and an instance-level spy on the log-prob method, which none of the wrappers
    # below reads or changes (dapo-generation-batch-normalizer hands TRL a copy of the inputs with the same
    # old_per_token_logps; entropy-coef-normalizer's spy calls this one's): they stack in any order.
    Patch(
        id="kl-bias-correction-sequence",
        summary="use_bias_correction_kl with importance_sampling_level='sequence': the KL is multiplied by the per-token "
        "ratio, as PR #7188",
        symptom="silent: beta != 0 with importance_sampling_level='sequence': the KL gets the sequence ratio, a spurious "
        "gradient term (sum of the KL) * grad mean log pi",
        upstream="https://github.com/huggingface/trl/issues/6586 (open; PR #7188 open, PR #6594 closed unmerged)",
        fixed_in={},
        must_exist="GRPOTrainer._compute_loss",
        changes=("GRPOTrainer._compute_loss",),
        # introduced by PR #4638 (f7d4985a7, 0.26.0.dev0: main before it has no use_bias_correction_kl, "not needed");
        # the default since 1.10.0 (PR #6503); the wheels of 0.26.0 - 1.16.0 hold the same lines
        requires={"trl": affected("0.26.0")},
        witnesses={"trl": {"inside": ["0.26.0.dev0", "0.26.0", "0.29.1", "1.0.0", "1.10.0", "1.16.0"], "outside": ["0.25.1"]}},
        remove_when=(
            "a TRL release multiplies the KL by the per-token importance-sampling ratio (issue #6586) and older "
            "releases are no longer supported"
        ),
    ),
    # -- vision-language models: the processor's mm_token_type_ids (TRL 0.24 - 0.29.0 on transformers 5) --------
    # Last in the registry: it stacks above every other wrapper of the log-prob function (vllm-is-truncated-support
    # binds its arguments to TRL's signature, which takes no mm_token_type_ids before 0.29.0: this one takes them
    # out first), of _generate_and_score_completions and of _compute_loss (it adds a key to the batch, and reads
    # the one the loss is handed).
    Patch(
        id="vlm-mm-token-type-ids",
        summary="VLM processors returning mm_token_type_ids: every log-prob forward gets them, zeros over the "
        "completion, as TRL 0.29.1",
        symptom="TypeError: GRPOTrainer._get_per_token_logps_and_entropies() got an unexpected keyword argument "
        "'mm_token_type_ids' (0.24 - 0.28); IndexError in the model's get_rope_index (0.29.0); the loss's forward without them",
        upstream="https://github.com/huggingface/trl/pull/5178 (fixed in 0.29.1; PR #5176 made the log-prob function take "
        "them in 0.29.0)",
        fixed_in={"trl": "0.29.1"},
        must_exist="GRPOTrainer._get_per_token_logps_and_entropies",
        changes=(
            "GRPOTrainer._get_per_token_logps_and_entropies",
            "GRPOTrainer._generate_and_score_completions",
            "GRPOTrainer._compute_loss",
        ),
        # trl: PR #4114 (9603b41d7, 0.24.0.dev0) hands the processor's output on as **forward_kwargs; PR #5178 reached
        # 0.29.1 (main's 0.29.0.dev0 / 1.0.0.dev0 builds around it: the probe reads which). transformers: 4.x processors
        # return mm_token_type_ids only when asked, which GRPO never does; 5.x's ERNIE-4.5-VL (and from 5.3 the
        # Qwen-VL family and GLM-4V) return them unasked.
        requires={"trl": affected("0.24.0", "0.29.1"), "transformers": affected("5.0.0")},
        witnesses={
            "trl": {
                "inside": ["0.24.0.dev0", "0.24.0", "0.26.2", "0.27.1", "0.28.0", "0.29.0", "0.29.1.dev0"],
                "outside": ["0.23.1", "0.29.1", "1.0.0"],
            },
            "transformers": {"inside": ["5.0.0", "5.2.0", "5.3.0", "5.16.1"], "outside": ["4.57.6"]},
        },
        remove_when="trl_compat no longer supports TRL 0.24 - 0.29.0 on transformers 5",
    ),
]


def declared(patch_id: str) -> Patch:
    """The entry of ``patch_id`` above."""
    for patch in PATCHES:
        if patch.id == patch_id:
            return patch
    raise KeyError(f"no trl_compat patch {patch_id!r}")
