"""The project's boto3 ``lambda`` client: what it puts on the wire."""

from __future__ import annotations

import botocore
from botocore.awsrequest import AWSResponse

from moeless import __version__
from moeless.lambda_host.client import lambda_client


class _Reply:
    """A raw HTTP body for botocore's response parser."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, **_kwargs):
        yield self.body


def test_requests_carry_the_fixed_user_agent_unsigned_to_a_local_endpoint():
    client = lambda_client("http://127.0.0.1:1")
    sent = []

    def capture(request, **_kwargs):  # answers in place of the network
        sent.append(request)
        return AWSResponse(request.url, 200, {}, _Reply(b'{"ok": true}'))

    client.meta.events.register("before-send.lambda.Invoke", capture)
    for _ in range(2):
        client.invoke(FunctionName="f", Payload=b"{}")
    assert len(sent) == 2
    for request in sent:
        assert (
            request.headers["User-Agent"].decode() == f"moeless/{__version__} Botocore/{botocore.__version__}"
        )
        assert "Authorization" not in request.headers
