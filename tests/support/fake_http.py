"""The one stand-in for a server's HTTP answer that tests hand TRL's ``VLLMClient`` (through its
``session``): the fake servers of the server-mode tests answer every request with a ``JsonResponse``."""


class JsonResponse:
    """A 200 answer carrying ``body``, as ``requests.Response`` shows it to TRL's client."""

    status_code = 200

    def __init__(self, body):
        self._body = body
        self.text = str(body)

    def json(self):
        return self._body


class RecordingSession:
    """The server's HTTP side: every request answered 200."""

    def post(self, url, **kwargs):
        return JsonResponse({"success": True})


def packed_server_client(monkeypatch, base_url="http://server:8000"):
    """TRL >= 1.11's real ``VLLMClient`` without a server; its weight-transfer group the stand-in's
    recorder (``client.communicator.sent``: one list of ``(name, tensor)`` per packed broadcast)."""
    from trl.generation.vllm_client import VLLMClient
    from vllm.distributed.weight_transfer._recorder import TrainerGroup

    monkeypatch.setattr("atexit.register", lambda function: None)
    client = VLLMClient.__new__(VLLMClient)  # __init__ would wait for a server
    client.base_url, client.session, client._updating_weights = base_url, RecordingSession(), False
    client.communicator = TrainerGroup({})
    return client
