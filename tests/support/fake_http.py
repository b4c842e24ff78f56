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
