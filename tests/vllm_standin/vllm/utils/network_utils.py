"""Stand-in for ``vllm.utils.network_utils`` (imported by TRL 1.x)."""

import socket


def get_ip() -> str:
    return "127.0.0.1"


def get_open_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
