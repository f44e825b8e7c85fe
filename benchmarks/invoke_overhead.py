"""What an expert costs when it is a function: warm invoke overhead and cold-start time on the local host.

Usage:
    .venv/bin/python benchmarks/invoke_overhead.py            # hidden 1024 and 4096, 1/8/64 tokens
    .venv/bin/python benchmarks/invoke_overhead.py --quick    # hidden 1024 only, fewer runs

For each expert size and token batch it measures, in the same run:
  * in-process: onnxruntime ``session.run`` on the expert's ONNX file (1 thread, like a 1,769 MB function);
  * host/boto3: a warm ``lambda.invoke`` through the local host (boto3 client -> Invoke API -> Runtime
    API -> awslambdaric process -> handler -> back), payload encoded/decoded as the backbone does;
  * host/http: the same invoke with a bare keep-alive HTTP client, to separate boto3's own cost;
called in turn (so machine noise hits all three alike); it prints p50/p99 of each and the overhead
(p50 round trip - p50 in-process), and the p50 compute time the function itself reports
("in function": the same session.run, slowed by sharing the cores). On a 2-core machine the
client, the host and the instance share the cores, which the in-process baseline does not pay.
Then it cold-starts the function several times and splits the cold start into process start
(interpreter, awslambdaric, imports) and session init (manifest, checksums, onnxruntime sessions).

The artifacts (a 1-layer tiny Mixtral per hidden size) are built once under .moeless/bench/.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import statistics
import time
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

from moeless.contracts.manifest import load_manifest
from moeless.contracts.payload import decode_matrix, encode_request, payload_json
from moeless.contracts.plan import one_function_per_expert
from moeless.lambda_host import LambdaHost
from moeless.lambda_host.client import lambda_client
from moeless.lambda_host.experts import expert_function_configs

REPO = Path(__file__).resolve().parent.parent
FULL_SIZES = ((1024, 2816), (4096, 14336))
QUICK_SIZES = ((1024, 2816),)
BATCHES = (1, 8, 64)
WORKDIR = REPO / ".moeless" / "bench"


def artifacts_for(hidden: int, inter: int) -> Path:
    """A packaged 1-layer, 2-expert tiny Mixtral with experts of the given size (cached)."""
    from moeless.model.packaging import package
    from moeless.model.tiny import TinySpec, build_tiny_model

    root = WORKDIR / f"mixtral-{hidden}x{inter}"
    if not (root / "artifacts" / "manifest.json").is_file():
        spec = TinySpec(arch="mixtral", layers=1, experts=2, hidden=hidden, intermediate=inter)
        build_tiny_model(root / "model", spec)
        package(root / "model", root / "artifacts", progress=True)
    return root / "artifacts"


def interleaved_samples_ms(fns: list, min_runs: int, min_seconds: float, max_runs: int) -> list[list[float]]:
    """Wall times in ms of each of ``fns``, called in turn each round so that noise hits all alike."""
    for fn in fns:
        fn()
        fn()
    times: list[list[float]] = [[] for _ in fns]
    started = time.perf_counter()
    while len(times[0]) < max_runs and (
        len(times[0]) < min_runs or time.perf_counter() - started < min_seconds
    ):
        for fn, series in zip(fns, times, strict=True):
            t0 = time.perf_counter()
            fn()
            series.append((time.perf_counter() - t0) * 1e3)
    return times


def p50_p99(times: list[float]) -> tuple[float, float]:
    ordered = sorted(times)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


class RawInvoker:
    """Invoke over one keep-alive HTTP connection: the host's cost without boto3's."""

    def __init__(self, endpoint_url: str, function: str) -> None:
        parts = urlsplit(endpoint_url)
        self.connection = http.client.HTTPConnection(parts.hostname, parts.port)
        self.path = f"/2015-03-31/functions/{function}/invocations"

    def __call__(self, payload: bytes) -> dict:
        self.connection.request("POST", self.path, payload, {"Content-Type": "application/json"})
        response = self.connection.getresponse()
        return json.loads(response.read())


def bench_size(hidden: int, inter: int, batches: tuple[int, ...], runs: tuple[int, float, int], colds: int):
    import onnxruntime as ort

    from moeless.experts.session import session_options

    artifacts = artifacts_for(hidden, inter)
    manifest = load_manifest(artifacts)
    plan = one_function_per_expert(manifest)
    config = expert_function_configs(artifacts, plan, REPO / "functions" / "expert")[0]
    name = config.name
    session = ort.InferenceSession(
        str(artifacts / manifest.expert(0, 0).file), session_options(1), providers=["CPUExecutionProvider"]
    )
    rows = []
    with LambdaHost([config]) as host:
        client = lambda_client(host.endpoint_url)
        raw = RawInvoker(host.endpoint_url, name)
        rng = np.random.default_rng(0)
        for tokens in batches:
            x = rng.standard_normal((tokens, hidden), dtype=np.float32)

            compute_ms: list[float] = []

            def boto3_invoke(x=x, compute_ms=compute_ms):
                payload = payload_json(encode_request(0, 0, x))
                reply = json.loads(client.invoke(FunctionName=name, Payload=payload)["Payload"].read())
                compute_ms.append(reply["compute_ms"])
                return decode_matrix(reply)

            def raw_invoke(x=x):
                return decode_matrix(raw(payload_json(encode_request(0, 0, x))))

            expected = session.run(["output"], {"hidden": x})[0]
            np.testing.assert_array_equal(boto3_invoke(), expected)

            def in_process(x=x):
                return session.run(["output"], {"hidden": x})

            series = interleaved_samples_ms([in_process, boto3_invoke, raw_invoke], *runs)
            in_function = statistics.median(compute_ms[-len(series[1]) :])
            rows.append((hidden, tokens, *(p50_p99(times) for times in series), in_function))
        cold = []
        for _ in range(colds):
            for instance in list(host.pools[name].instances):
                host.pools[name].evict(instance)
                instance.process.wait()
            x = np.zeros((1, hidden), np.float32)
            response = client.invoke(
                FunctionName=name, Payload=json.dumps(encode_request(0, 0, x)), LogType="Tail"
            )
            reply = json.loads(response["Payload"].read())
            report = base64.b64decode(response["LogResult"]).decode().splitlines()[-1]
            total = float(report.split("Init Duration: ")[1].split(" ms")[0])
            cold.append((total, reply["init_ms"]))
    expert_mb = manifest.expert(0, 0).bytes / 1e6
    return rows, cold, expert_mb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="hidden 1024 only, fewer runs")
    args = parser.parse_args()
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    runs = (20, 0.5, 200) if args.quick else (30, 3.0, 1000)
    colds = 3 if args.quick else 5
    print("warm invoke: round trip through the local host vs onnxruntime in-process (ms, p50 / p99)")
    header = (
        f"{'hidden':>6} {'tokens':>6} | {'in-process':>15} | {'host via boto3':>15} {'overhead':>8} | "
        f"{'host via http':>15} {'overhead':>8} | {'in function':>11}"
    )
    print(header)
    cold_rows = []
    for hidden, inter in sizes:
        rows, cold, expert_mb = bench_size(hidden, inter, BATCHES, runs, colds)
        for hidden_, tokens, local, via_boto3, via_http, in_function in rows:
            print(
                f"{hidden_:>6} {tokens:>6} | {local[0]:7.2f} /{local[1]:7.2f} | "
                f"{via_boto3[0]:7.2f} /{via_boto3[1]:7.2f} {via_boto3[0] - local[0]:8.2f} | "
                f"{via_http[0]:7.2f} /{via_http[1]:7.2f} {via_http[0] - local[0]:8.2f} | {in_function:11.2f}"
            )
        cold_rows.append((hidden, inter, expert_mb, cold))
    print("\ncold start (median of runs): process start = host-measured init - handler's session init")
    print(f"{'expert':>16} {'MB':>6} | {'process start':>13} | {'session init':>12} | {'total':>8}")
    for hidden, inter, expert_mb, cold in cold_rows:
        total = statistics.median(t for t, _ in cold)
        session_init = statistics.median(s for _, s in cold)
        print(
            f"{f'{hidden}x{inter}':>16} {expert_mb:6.0f} | {total - session_init:13.1f} | "
            f"{session_init:12.1f} | {total:8.1f}"
        )


if __name__ == "__main__":
    main()
