"""One execution environment: an ``awslambdaric`` process and the Runtime API it polls.

Like a Lambda sandbox, each instance gets its own Runtime API endpoint (here a ThreadingHTTPServer
on 127.0.0.1 and a free port), handles one invocation at a time, and is done when its process exits.
Init ends when the runtime first asks for ``/next``: that is when the handler module has been
imported, so ``init_ms`` = process start + handler init, the cold start a caller waits for.

States: ``initializing`` -> ``idle`` <-> ``busy`` -> ``dead``.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from moeless.lambda_host.httpserver import JsonHandler, LocalHTTPServer
from moeless.lambda_host.versions import LATEST, PUBLISHED_VERSION, REGION, function_arn

RUNTIME_PREFIX = "/2018-06-01/runtime"
# what a Lambda sandbox passes through from the host environment
PASSED_THROUGH = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT")


@dataclass
class FunctionConfig:
    """How to run one function's instances.

    Attributes:
        name: the Lambda function name callers use.
        task_root: folder with the handler module (``LAMBDA_TASK_ROOT``); the process's cwd.
        handler: ``module.function``.
        environment: the function's environment variables.
        memory_mb: configured memory (bills duration; sets the vCPU count the handler sees).
        timeout_s: the longest an invocation may run before the instance is killed.
        python: interpreter with ``awslambdaric`` and the handler's requirements installed.
        pythonpath: extra import roots (the image's site-packages stand-in).
        reserved_concurrency: at most this many concurrent invocations (``None``: no reservation).
    """

    name: str
    task_root: Path
    handler: str = "handler.handler"
    environment: dict[str, str] = field(default_factory=dict)
    memory_mb: int = 1769
    timeout_s: float = 30.0
    python: str = "python3"
    pythonpath: list[str] = field(default_factory=list)
    reserved_concurrency: int | None = None


@dataclass
class Invocation:
    """One request on its way through an instance; ``done`` is set once ``body`` is final.

    ``qualifier`` is what the caller invoked (it names the ARN the handler sees), ``version`` what
    that runs (the START line's and ``X-Amz-Executed-Version``'s version).
    """

    payload: bytes
    qualifier: str
    version: str
    request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    body: bytes = b""
    function_error: str | None = None
    init_ms: float = 0.0  # the on-demand cold start this invocation waited for
    provisioned: bool = False
    handed_at: float = 0.0
    duration_ms: float = 0.0
    log_offset: int = 0
    delivered: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)

    def finish(self, body: bytes, function_error: str | None = None) -> None:
        if self.done.is_set():
            return
        if self.handed_at:
            self.duration_ms = (time.perf_counter() - self.handed_at) * 1e3
        self.body, self.function_error = body, function_error
        self.delivered.set()
        self.done.set()


def error_body(error_type: str, message: str) -> bytes:
    return json.dumps({"errorType": error_type, "errorMessage": message}).encode()


class Instance:
    """A running (or starting) execution environment of one function.

    Args:
        config: the function it runs.
        qualifier: the alias/version whose provisioned concurrency it belongs to, or ``None`` (on-demand).
        log_path: the instance's log stream (stdout/stderr of the process, plus START/END/REPORT lines).
        on_ready: called once init finished (first ``/next``).
        on_exit: called once the process is gone.
    """

    def __init__(
        self,
        config: FunctionConfig,
        qualifier: str | None,
        log_path: Path,
        on_ready: Callable[[Instance], None],
        on_exit: Callable[[Instance], None],
    ) -> None:
        self.config = config
        self.qualifier = qualifier
        self.id = uuid.uuid4().hex[:12]
        self.state = "initializing"
        self.current: Invocation | None = None
        self.init_ms = 0.0
        self.init_error: bytes | None = None
        self.retire_when_idle = False
        self.last_used = time.monotonic()
        self._lock = threading.Lock()
        self._mailbox: queue.SimpleQueue[Invocation | None] = queue.SimpleQueue()
        self._exit_reply: bytes | None = None
        self._on_ready, self._on_exit = on_ready, on_exit
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log: IO[str] = open(log_path, "a", buffering=1)  # noqa: SIM115 - closed when the process exits

        self.server = _RuntimeApiServer(("127.0.0.1", 0), _RuntimeApiHandler)
        self.server.instance = self
        threading.Thread(target=self.server.serve_forever, name=f"runtime-{self.id}", daemon=True).start()
        self.spawned_at = time.perf_counter()
        self.process = subprocess.Popen(
            [config.python, "-m", "awslambdaric", config.handler],
            cwd=config.task_root,
            env=self._environment(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the host stops its instances itself, after draining them
        )
        threading.Thread(target=self._watch, name=f"watch-{self.id}", daemon=True).start()

    @property
    def provisioned(self) -> bool:
        return self.qualifier is not None

    @property
    def runtime_api(self) -> str:
        host, port = self.server.server_address[:2]
        return f"{host!s}:{port}"

    def _environment(self) -> dict[str, str]:
        config = self.config
        env = {key: os.environ[key] for key in PASSED_THROUGH if key in os.environ}
        env |= {
            "AWS_LAMBDA_RUNTIME_API": self.runtime_api,
            "AWS_LAMBDA_FUNCTION_NAME": config.name,
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(config.memory_mb),
            "AWS_LAMBDA_FUNCTION_VERSION": PUBLISHED_VERSION if self.provisioned else LATEST,
            "AWS_LAMBDA_INITIALIZATION_TYPE": "provisioned-concurrency" if self.provisioned else "on-demand",
            "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/{config.name}",
            "AWS_LAMBDA_LOG_STREAM_NAME": self.id,
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            "LAMBDA_TASK_ROOT": str(config.task_root),
            "_HANDLER": config.handler,
            "TZ": ":UTC",
        }
        if config.pythonpath:
            env["PYTHONPATH"] = os.pathsep.join(config.pythonpath)
        return env | config.environment

    # --- called by the pool, under the host's scheduling lock -------------------------------------

    def try_reserve(self) -> bool:
        """Claim an idle, live instance for one invocation."""
        with self._lock:
            if self.state != "idle" or self.process.poll() is not None:
                return False
            self.state = "busy"
            return True

    def assign(self, invocation: Invocation) -> bool:
        """Hand a (reserved or still initialising) instance its invocation; ``False`` if it died first."""
        invocation.provisioned = self.provisioned
        with self._lock:
            if self.state == "dead":
                return False
            self.current = invocation
            if self.state == "initializing":
                self.state = "initializing-busy"
            self._mailbox.put(invocation)
        return True

    def release(self, invocation: Invocation) -> bool:
        """Take back an invocation whose runtime has not asked for it yet (its init overran), and
        retire the instance; ``False`` once the runtime has it."""
        with self._lock:
            if self.current is not invocation or self.state != "initializing-busy":
                return False
            self.current = None
            self.state = "initializing"
            self.retire_when_idle = True
            self._mailbox = queue.SimpleQueue()  # the invocation must never reach this runtime
        return True

    def kill(self, reply: bytes | None = None) -> None:
        """Stop the process; an invocation in flight gets ``reply`` (or an exit error)."""
        with self._lock:
            self._exit_reply = reply
        if self.process.poll() is None:
            self.process.kill()

    def stop(self, grace_s: float = 2.0) -> None:
        """Shut down: no more invocations, process terminated, endpoint closed."""
        self._mailbox.put(None)
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.process.wait()
        self.server.shutdown()
        self.server.server_close()

    def write_log(self, text: str) -> int:
        """Append host lines (START/END/REPORT) to the log stream; returns the offset they start at."""
        with self._lock:
            if self._log.closed:
                return 0
            offset = self._log.tell()
            self._log.write(text)
            return offset

    # --- called by the Runtime API (the instance's own threads) ------------------------------------

    def next_invocation(self) -> Invocation | None:
        """Block until there is work; the first call marks the end of init."""
        with self._lock:
            if self.state in ("initializing", "initializing-busy"):
                self.init_ms = (time.perf_counter() - self.spawned_at) * 1e3
                self.state = "busy" if self.state == "initializing-busy" else "idle"
                first = True
            else:
                first = False
        if first:
            self._on_ready(self)
        invocation = self._mailbox.get()
        if invocation is None:
            return None
        if first and not self.provisioned:
            invocation.init_ms = self.init_ms
        invocation.log_offset = self.write_log(
            f"START RequestId: {invocation.request_id} Version: {invocation.version}\n"
        )
        invocation.handed_at = time.perf_counter()
        invocation.delivered.set()
        return invocation

    def complete(self, request_id: str, body: bytes, function_error: str | None) -> bool:
        """The runtime posted a result; ``False`` when it is not the current invocation's."""
        with self._lock:
            invocation = self.current
            if invocation is None or invocation.request_id != request_id:
                return False
            self.current = None
            self.state = "idle"
            self.last_used = time.monotonic()
        invocation.finish(body, function_error)
        return True

    def init_failed(self, body: bytes) -> None:
        with self._lock:
            self.init_error = body

    def _watch(self) -> None:
        self.process.wait()
        with self._lock:
            self.state = "dead"
            invocation, self.current = self.current, None
            reply = self._exit_reply or self.init_error
        if invocation is not None:
            code = self.process.returncode
            how = f"signal: {-code}" if code < 0 else f"exit status {code}"
            invocation.finish(
                reply or error_body("Runtime.ExitError", f"Error: Runtime exited with error: {how}"),
                "Unhandled",
            )
        self._on_exit(self)
        with self._lock:
            self._log.close()


class _RuntimeApiServer(LocalHTTPServer):
    instance: Instance


class _RuntimeApiHandler(JsonHandler):
    """The Lambda Runtime API, as the ``awslambdaric`` client uses it."""

    server: _RuntimeApiServer

    def do_GET(self) -> None:
        if self.path != f"{RUNTIME_PREFIX}/invocation/next":
            self.send_json(404, error_body("NotFound", self.path))
            return
        instance = self.server.instance
        invocation = instance.next_invocation()
        if invocation is None:  # shutting down: drop the connection, the process is being stopped
            self.close_connection = True
            return
        deadline_ms = int(time.time() * 1e3 + instance.config.timeout_s * 1e3)
        self.send_json(
            200,
            invocation.payload,
            {
                "Lambda-Runtime-Aws-Request-Id": invocation.request_id,
                "Lambda-Runtime-Deadline-Ms": str(deadline_ms),
                "Lambda-Runtime-Invoked-Function-Arn": function_arn(
                    instance.config.name, invocation.qualifier
                ),
                "Lambda-Runtime-Trace-Id": f"Root=1-{int(time.time()):08x}-{uuid.uuid4().hex[:24]}",
            },
        )

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        instance = self.server.instance
        parts = self.path.removeprefix(RUNTIME_PREFIX).strip("/").split("/")
        if parts == ["init", "error"]:
            instance.init_failed(body)
            self.send_json(202, b'{"status":"OK"}')
        elif len(parts) == 3 and parts[0] == "invocation" and parts[2] in ("response", "error"):
            error = "Unhandled" if parts[2] == "error" else None
            if instance.complete(parts[1], body, error):
                self.send_json(202, b'{"status":"OK"}')
            else:
                self.send_json(400, error_body("InvalidRequestID", f"not the current invocation: {parts[1]}"))
        else:
            self.send_json(404, error_body("NotFound", self.path))
