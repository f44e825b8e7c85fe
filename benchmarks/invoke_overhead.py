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
Writes benchmarks/results/invoke_overhead.md.
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
from common import md_header, md_row, write_result

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
    lines = [
        "Warm invoke: the round trip through the local host against onnxruntime in-process, one "
        "onnxruntime thread on both sides; ms, p50 / p99; overhead = p50 round trip - p50 in-process; "
        '"in function" = the p50 compute time the function reports.',
        "",
        *md_header(
            (
                "expert",
                "tokens",
                "in-process",
                "via boto3",
                "overhead",
                "via bare HTTP",
                "overhead",
                "in function",
            )
        ),
    ]
    print("\n".join(lines))
    cold_rows = []
    for hidden, inter in sizes:
        rows, cold, expert_mb = bench_size(hidden, inter, BATCHES, runs, colds)
        for _, tokens, local, via_boto3, via_http, in_function in rows:
            expert = f"{hidden} x {inter}" if tokens == BATCHES[0] else ""
            boto3_cells = (f"{via_boto3[0]:.2f} / {via_boto3[1]:.2f}", f"{via_boto3[0] - local[0]:.2f}")
            http_cells = (f"{via_http[0]:.2f} / {via_http[1]:.2f}", f"{via_http[0] - local[0]:.2f}")
            local_cell = f"{local[0]:.2f} / {local[1]:.2f}"
            lines.append(
                md_row((expert, tokens, local_cell, *boto3_cells, *http_cells, f"{in_function:.2f}"))
            )
            print(lines[-1], flush=True)
        cold_rows.append((hidden, inter, expert_mb, cold))
    cold_lines = [
        "",
        f"Cold start (median of {colds}): process start (python, awslambdaric, imports) = host-measured "
        "init - the handler's session init (checksums, onnxruntime).",
        "",
        *md_header(("expert (ONNX size)", "process start ms", "session init ms", "total ms")),
    ]
    for hidden, inter, expert_mb, cold in cold_rows:
        total = statistics.median(t for t, _ in cold)
        session_init = statistics.median(s for _, s in cold)
        expert = f"{hidden} x {inter} ({expert_mb:.0f} MB)"
        cold_lines.append(
            md_row((expert, f"{total - session_init:.0f}", f"{session_init:.0f}", f"{total:.0f}"))
        )
    print("\n".join(cold_lines))
    write_result("invoke_overhead", "an expert invoked through the local Lambda host", lines + cold_lines)


if __name__ == "__main__":
    main()
